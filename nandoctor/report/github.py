"""GitHub Actions output: workflow-command annotations and the job's step summary.

Annotations (`::error file=...,line=...,title=...::message`) put the culprit on the line of
the pull request diff; the step summary ($GITHUB_STEP_SUMMARY) shows the whole story as
markdown on the run page. Both only inside GitHub Actions (see `outputs`). The runner reads
workflow commands from a step's stderr as well as its stdout, so `nandoctor run` prints its
annotations on stderr, leaving stdout to the script.

Escaping follows GitHub's workflow-command rules: in the message (data) `%`, CR and LF; in
properties (`file`, `title`) also `:` and `,`, which would otherwise end the property.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, TextIO

from nandoctor.report.model import Site, RunReport
from nandoctor.report.render import AppendFile, Output, Stream
from nandoctor.report.text import checks, discarded_summary, plural, problem_line, steps_done
from nandoctor.stats import one_line

if TYPE_CHECKING:
    from nandoctor.datacheck.model import DataReport, Problem

# Markdown rows listed at most in a data summary (the step summary is capped at 1 MiB).
MAX_SUMMARY_ROWS = 200
# Characters of the explanation put in an annotation (the summary has the full text).
_SHORT = 300


@dataclass(frozen=True)
class Annotations:
    """`::error`/`::warning` workflow commands, one a line; at most `limit` for a data check
    (None: no limit). `file=` is relative to `workspace` ($GITHUB_WORKSPACE) when given."""

    limit: int | None = 10
    workspace: str | None = None

    def render_run(self, report: RunReport) -> str:
        return _lines(run_annotations(report, self.workspace))

    def render_data(self, report: DataReport) -> str:
        return _lines(data_annotations(report, self.limit, self.workspace))


def annotation_path(file: str | None, workspace: str | None) -> str | None:
    """`file` as GitHub wants it in an annotation: relative to the workspace (the repository
    checkout) when it lies under it, relative paths being taken from the current directory;
    otherwise unchanged."""
    if not file or not workspace:
        return file
    path, root = Path(os.path.abspath(file)), Path(os.path.abspath(workspace))
    try:
        pairs = [(path, root), (path.resolve(), root.resolve())]  # then through symlinks
    except (OSError, RuntimeError):
        pairs = [(path, root)]
    for candidate, base in pairs:
        try:
            return candidate.relative_to(base).as_posix()
        except ValueError:
            continue
    return file


class StepSummary:
    """Markdown for $GITHUB_STEP_SUMMARY."""

    def render_run(self, report: RunReport) -> str:
        return run_summary_markdown(report)

    def render_data(self, report: DataReport) -> str:
        return data_summary_markdown(report)


def in_github_actions(environ: Mapping[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get("GITHUB_ACTIONS") == "true"


def outputs(stream: TextIO, max_annotations: int | None = 10,
            environ: Mapping[str, str] | None = None) -> list[Output]:
    """Inside GitHub Actions: the annotations on `stream`, and the summary appended to the
    $GITHUB_STEP_SUMMARY file when there is one. Elsewhere nothing.

    A summary file that cannot be written becomes a `::warning` on `stream`, never a failure.
    """
    environ = os.environ if environ is None else environ
    if not in_github_actions(environ):
        return []
    workspace = environ.get("GITHUB_WORKSPACE") or None
    found = [Output(Annotations(max_annotations, workspace), Stream(stream))]
    summary_path = environ.get("GITHUB_STEP_SUMMARY")
    if summary_path:
        def warn(exc: OSError) -> None:
            message = f"nandoctor could not write the step summary: {exc.strerror or exc}"
            Stream(stream).write(_lines([workflow_command("warning", message)]))

        found.append(Output(StepSummary(), AppendFile(Path(summary_path), on_error=warn)))
    return found


def _lines(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def escape_data(value: Any) -> str:
    return str(value).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(value: Any) -> str:
    return escape_data(value).replace(":", "%3A").replace(",", "%2C")


def workflow_command(command: str, message: str, **properties: Any) -> str:
    """`::command key=value,...::message` with every piece escaped; None properties are left out."""
    props = ",".join(f"{k}={escape_property(v)}" for k, v in properties.items() if v is not None)
    return f"::{command}{' ' + props if props else ''}::{escape_data(message)}"


def _short(text: str) -> str:
    """The first paragraph, cut at a sentence end near `_SHORT` characters."""
    first = text.strip().split("\n\n", 1)[0].replace("\n", " ")
    if len(first) <= _SHORT:
        return first
    cut = first.rfind(". ", 0, _SHORT)
    return first[: cut + 1] if cut > 0 else first[: _SHORT - 1].rstrip() + "…"


# -- nandoctor run ----------------------------------------------------------------------


def run_annotations(report: RunReport, workspace: str | None = None) -> list[str]:
    """One `::error` on the root op's source line for a non-finite run; nothing otherwise."""
    root = report.root or report.event
    if report.status != "nonfinite" or root is None:
        return []
    cause = report.cause
    title = cause.title if cause else "Non-finite value"
    where = f" at {root.location}" if root.location else ""
    lines = [f"{title}: {root.op or '(no op)'} in {root.phase}{where}"]
    if root.module:
        lines.append(f"module: {root.module}")
    if cause and cause.explanation:
        lines.append(_short(cause.explanation))
    if cause and cause.fix:
        lines.append(f"Fix: {_short(cause.fix)}")
    location = root.location
    return [workflow_command(
        "error", "\n".join(lines),
        file=annotation_path(location.file, workspace) if location else None,
        line=location.line if location else None,
        title=f"nandoctor: {title}",
    )]


def _md_code(value: Any) -> str:
    """An inline code span that survives backticks in the text."""
    text = str(value).replace("\n", " ")
    fence = "`"
    while fence in text:
        fence += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _cell(value: Any) -> str:
    """A table cell: pipes escaped (also inside code spans, as GitHub's tables require)."""
    return str(value).replace("|", "\\|")


def _md_text(value: Any) -> str:
    return str(value).replace("\r", "").strip()


def _row(label: str, site: Site) -> str:
    cells = [
        label,
        _md_code(site.op) if site.op else "(no op)",
        site.phase,
        _md_code(site.location) if site.location else "?",
        _md_code(site.module) if site.module else "",
    ]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def run_summary_markdown(report: RunReport) -> str:
    """Markdown for $GITHUB_STEP_SUMMARY: the verdict first, then where, what went in, why."""
    script = _md_code(report.script)
    steps = plural(report.step, "optimizer step") if report.step is not None else "no optimizer step seen"
    if report.status == "clean":
        stopped = " (stopped at max_steps)" if report.stopped_by == "max_steps" else ""
        seen = discarded_summary(report.discarded)
        what = seen or "no NaN/Inf"
        return f"✅ **nandoctor**: {script} ran clean — {_md_text(what)}, {steps}{stopped}.\n"
    if report.status == "script_error":
        error = report.error or {}
        what = f"{error.get('type', 'an error')}: {error.get('message', '')}".rstrip(": ")
        return (f"### ⚠️ nandoctor: {script} failed (exit status {report.exit_code})\n\n"
                f"The script raised {_md_code(what)} before any non-finite value was seen ({steps}).\n")

    cause = report.cause
    title = cause.title if cause else "Non-finite value"
    out = [f"### ❌ nandoctor: non-finite value in {script}", ""]
    when = steps_done(report.step) if report.step is not None else "no optimizer step seen yet"
    out.append(f"**{_md_text(title)}**" + (f" ({_md_code(cause.id)})" if cause else "") + f" — {when}.")
    out.append("")
    out.append("| | op | phase | location | module |")
    out.append("|---|---|---|---|---|")
    if report.event is not None:
        out.append(_row("event", report.event))
    root = report.root or report.event
    if root is not None and root != report.event:
        out.append(_row("root", root))
    elif root is not None:
        out[-1] = _row("event = root", root)
    if root is not None and root.location is not None and root.location.code:
        out += ["", f"{_md_code(root.location)}, in {_md_code(root.location.function)}:", "",
                "```python", root.location.code.replace("```", "` ` `"), "```"]
    if root is not None and (root.inputs or root.output is not None):
        out += ["", "**Inputs of the root op**", ""]
        out += [f"- {_md_code(one_line(s))}" for s in root.inputs]
        if root.output is not None:
            out.append(f"- output: {_md_code(one_line(root.output))}")
    if len(report.lineage) > 1:
        out += ["", "**Lineage** (root first)", ""]
        for i, site in enumerate(report.lineage, 1):
            where = f" at {_md_code(site.location)}" if site.location else ""
            module = f" in {_md_code(site.module)}" if site.module else ""
            out.append(f"{i}. {_md_code(site.op or '(no op)')} ({site.phase}){where}{module}")
    if cause is not None:
        if cause.explanation:
            out += ["", f"**Cause.** {_md_text(cause.explanation)}"]
        if cause.fix:
            out += ["", f"**Fix.** {_md_text(cause.fix)}"]
    return "\n".join(out) + "\n"


# -- nandoctor check-data ---------------------------------------------------------------


def data_annotations(report: DataReport, limit: int | None = 10,
                     workspace: str | None = None) -> list[str]:
    """One annotation per problem file (not per problem): `::error` when it has an error,
    `::warning` when it has only warnings; files with errors first; at most `limit`
    (None: no limit), then one `::warning` counting the files left out (a limit of 0 turns
    the annotations off)."""
    ordered = sorted(report.by_file().items(), key=lambda item: not _has_error(item[1]))
    left_out = 0
    if limit is not None:
        if limit <= 0:
            return []
        left_out = max(len(ordered) - limit, 0)
        ordered = ordered[:limit]
    lines = []
    for name, problems in ordered:
        command = "error" if _has_error(problems) else "warning"
        lines.append(workflow_command(command, "\n".join(problem_line(p) for p in problems),
                                      file=annotation_path(name, workspace),
                                      title=f"nandoctor check-data: {checks(problems)}"))
    if left_out:
        noun = "file" if left_out == 1 else "files"
        lines.append(workflow_command(
            "warning", f"and {left_out} more {noun} with problems (see the step summary / JSON report)",
            title="nandoctor check-data"))
    return lines


def _has_error(problems: list[Problem]) -> bool:
    return any(p.is_error for p in problems)


def data_summary_markdown(report: DataReport) -> str:
    problems = report.problems
    scanned = report.files_scanned
    if not problems:
        return f"✅ **nandoctor check-data**: {plural(scanned, 'file')} scanned, no problems.\n"
    by_file = report.by_file()
    error_files = sum(1 for ps in by_file.values() if _has_error(ps))
    icon = "❌" if error_files else "⚠️"
    out = [f"### {icon} nandoctor check-data: {len(by_file)} of {scanned} files with problems", ""]
    if error_files != len(by_file):
        out += [f"{error_files} with errors, {len(by_file) - error_files} with warnings only.", ""]
    out += ["| file | key | check | count | detail | severity |", "|---|---|---|---|---|---|"]
    for p in problems[:MAX_SUMMARY_ROWS]:
        cells = [
            _md_code(p.file),
            _md_code(p.key) if p.key is not None else "",
            _md_code(p.check),
            str(p.count),
            _md_text(p.detail).replace("\n", " "),
            p.severity,
        ]
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    if len(problems) > MAX_SUMMARY_ROWS:
        out += ["", f"…and {plural(len(problems) - MAX_SUMMARY_ROWS, 'more problem')} (see the JSON report)."]
    return "\n".join(out) + "\n"
