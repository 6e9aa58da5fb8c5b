"""The terminal report: what a person reads at a glance, for a run and for a data check.

Built from the plain reports with rich, and rendered by the console of the stream it goes
to: no colour when that stream is not a terminal or NO_COLOR is set (rich's own rules), so
it reads as plain text in a CI log. User strings are escaped for rich markup.
"""
from __future__ import annotations

import linecache
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from nandoctor.report.model import History, Location, Site, RunReport, SiteFacts
from nandoctor.report.text import decode_surrogates
from nandoctor.stats import one_line

if TYPE_CHECKING:
    from nandoctor.datacheck.model import DataReport, Problem

_BARS = "▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class Terminal:
    """Renders with `console`, the console of the stream the text will be written to."""

    console: Console
    context_lines: int = 2

    def render_run(self, report: RunReport) -> str:
        return self._text(run_renderable(report, self.context_lines))

    def render_data(self, report: DataReport) -> str:
        return self._text(*data_renderables(report))

    def _text(self, *renderables: RenderableType) -> str:
        with self.console.capture() as captured:
            for renderable in renderables:
                self.console.print(renderable)
        return captured.get()


# -- nandoctor run ----------------------------------------------------------------------


def run_renderable(report: RunReport, context_lines: int = 2):
    if report.status == "nonfinite":
        return _nonfinite(report, context_lines)
    if report.status == "script_error":
        return _script_error(report)
    return _clean(report)


def _clean(report: RunReport) -> Text:
    steps = f" over {report.step} optimizer steps" if report.step is not None else ""
    why = " (stopped at --max-steps)" if report.stopped_by == "max_steps" else ""
    made = sum(d.count for d in report.discarded)
    what = "no NaN or Inf" if not made else "no NaN or Inf that mattered"
    text = Text.from_markup(
        f"[bold green]nandoctor: clean[/] — {what} in {escape(report.script)}{steps}{why}; "
        f"the script exited {report.exit_code}."
    )
    for note in report.notes:
        text.append_text(Text.from_markup(f"\n[dim]note:[/] {escape(note)}"))
    return text


def _script_error(report: RunReport) -> Text:
    err = report.error or {}
    return Text.from_markup(
        f"[bold yellow]nandoctor: the script raised {escape(err.get('type', 'an exception'))}[/] "
        f"(exit {report.exit_code}); no NaN or Inf was seen before it"
        + (f" ({report.step} optimizer steps)." if report.step is not None else ".")
    )


def _nonfinite(report: RunReport, context_lines: int):
    root, event, cause = report.root, report.event, report.cause
    assert root is not None and event is not None
    parts: list = []
    if cause is not None:
        parts.append(Text.from_markup(f"[bold]{escape(cause.title)}[/]  [dim]({escape(cause.id)})[/]"))
        parts.append(Text(cause.explanation))
        if cause.fix:
            parts.append(Text.from_markup(f"[bold green]Fix:[/] {escape(cause.fix)}"))
        parts.append(Text(""))
    parts.append(_site_heading("Root", root))
    parts.append(_source(root.location, context_lines))
    parts.append(_tensors(root))
    if len(report.lineage) > 1:
        parts.append(Text(""))
        parts.append(_lineage(report.lineage))
    if event is not root and len(report.lineage) > 1:
        parts.append(Text.from_markup(f"[bold]Stopped[/] at the last op above: {escape(report.reason)}."))
    history = _history(report.history)
    if history is not None:
        parts.append(Text(""))
        parts.append(history)
    if report.mode == "watch":
        parts.append(_watch_line(report))
    for note in report.notes:
        parts.append(Text.from_markup(f"[dim]note:[/] {escape(note)}"))
    kind = _kind(event)
    where = f" at {root.location}" if root.location else ""
    title = f"nandoctor: {kind} in {root.phase}{escape(where)}"
    if report.step is not None:
        parts.insert(0, Text(f"after {report.step} optimizer step{'s' if report.step != 1 else ''}", style="dim"))
    return Panel(Group(*parts), title=f"[bold red]{title}[/]", title_align="left", border_style="red", expand=False)


def _watch_line(report: RunReport) -> Text:
    weights = {True: "[green]weights still finite: the bad update was not applied[/]",
               False: "[red]weights already non-finite[/]", None: "weights not checked (no optimizer seen)"}
    replay = {True: "reproduced under --mode trace", False: "[yellow]NOT reproduced on replay[/]", None: ""}
    bits = [b for b in (weights[report.weights_clean], replay[report.reproduced]) if b]
    return Text.from_markup("[bold]Watch mode:[/] " + "; ".join(bits))


def _kind(site: Site) -> str:
    return {"nan": "NaN", "inf": "Inf"}.get(site.made, "non-finite value")


def _site_heading(label: str, site: Site) -> Text:
    bits = [f"[bold]{label}:[/] [cyan]{escape(site.op or '(no op: value arrived non-finite)')}[/]", f"phase {site.phase}"]
    if site.backward_node:
        bits.append(f"backward of [cyan]{escape(site.backward_node)}[/]")
    if site.module:
        bits.append(f"module [magenta]{escape(site.module)}[/]")
    if site.location:
        bits.append(f"at {escape(str(site.location))} in {escape(site.location.function)}")
    return Text.from_markup("  ".join(bits))


def _source(location: Location | None, context: int) -> Text:
    if location is None:
        return Text("  (no source line: the op ran outside user code)", style="dim")
    filename = location.file
    lines = []
    for n in range(max(1, location.line - context), location.line + context + 1):
        text = linecache.getline(filename, n) or (linecache.getline(os.path.abspath(filename), n))
        if not text and n > location.line:
            break
        lines.append((n, text.rstrip("\n")))
    if not lines:
        lines = [(location.line, location.code)]
    out = Text()
    for n, text in lines:
        mark = "→" if n == location.line else " "
        style = "bold" if n == location.line else "dim"
        out.append(f"  {mark} {n:>4} │ {text}\n", style=style)
    return out


def _tensors(site: Site) -> Table:
    table = Table.grid(padding=(0, 1))
    table.add_column(style="dim")
    table.add_column()
    for s in site.inputs:
        table.add_row("  in ", _tensor_line(one_line(s), s.nonfinite))
    if site.output is not None:
        table.add_row("  out", _tensor_line(one_line(site.output).replace("output ", "", 1), site.output.nonfinite))
    if site.output is None and site.facts.device_flag is not None:
        made = "NaN" if site.facts.device_flag == "nan" else "Inf"
        table.add_row("  out", Text(f"{made} (seen by the op's device-side flag; values not kept)", style="bold red"))
    for label, value in fact_rows(site.facts):
        table.add_row("  fact", escape(f"{label}: {value}"))
    return table


def fact_rows(facts: SiteFacts) -> list[tuple[str, str]]:
    """The facts a reader acts on, one (label, value) row each. The rest (input producers,
    the leaking node, whether an input was untracked) feed the cause, which says them."""
    rows = []
    p = facts.parameter
    if p is not None:
        where = f"param_groups[{p.group}].params[{p.index}] " if p.group is not None else ""
        rows.append(("parameter", p.name or f"{where}shape {p.shape}"))
    if facts.optimizer:
        rows.append(("optimizer", facts.optimizer))
    b = facts.batch
    if b is not None:
        rows.append(("batch", f"{b.number}, {b.key}, rows {list(b.rows)}"
                     + (f", dataset indices {list(b.dataset_indices)}" if b.dataset_indices else "")))
    if facts.inf_written_at is not None or facts.inf_written_by:
        rows.append(("Inf written at", str(facts.inf_written_at or facts.inf_written_by)))
    if facts.ctc is not None:
        rows.append(("CTC lengths", f"input {list(facts.ctc.input_lengths)}, target {list(facts.ctc.target_lengths)}"))
    if facts.exponent is not None:
        rows.append(("exponent", f"{facts.exponent:g}"))
    if facts.loss is not None or facts.grad_norm is not None:
        rows.append(("at the boundary", f"loss {facts.loss}, gradient norm {facts.grad_norm}"))
    if facts.op_facts_error:
        rows.append(("op facts unavailable", facts.op_facts_error))
    return rows


def _tensor_line(line: str, bad: int) -> Text:
    text = Text(line)
    for word in ("NaN×", "+Inf×", "-Inf×"):
        start = line.find(word)
        if start >= 0:
            end = line.find(" ", start)
            text.stylize("bold red", start, end if end > 0 else len(line))
    return text


def _lineage(lineage: list[Site]) -> Table:
    table = Table(title="Lineage (root → where it stopped)", title_justify="left", show_edge=False, box=None, padding=(0, 1))
    for column in ("#", "op", "phase", "line", "module", "output"):
        table.add_column(column, style="dim" if column == "#" else None, overflow="fold")
    root_file = lineage[0].location.file if lineage and lineage[0].location else None
    for i, site in enumerate(lineage, 1):
        op = site.op + (f" ({site.backward_node})" if site.backward_node else "")
        table.add_row(
            str(i), escape(op or "-"), site.phase, escape(_short_location(site.location, root_file)),
            escape(site.module or "-"), _tensor_line(_counts(site), 1),
        )
    return table


def _short_location(location: Location | None, root_file: str | None) -> str:
    """`21` in the root's file, `losses.py:9` elsewhere."""
    if location is None:
        return "-"
    return str(location.line) if location.file == root_file else f"{location.file}:{location.line}"


def _counts(site: Site) -> str:
    o = site.output
    if o is None:
        return "-"
    return " ".join(f"{label}×{n}" for label, n in (("NaN", o.nan), ("+Inf", o.posinf), ("-Inf", o.neginf)) if n)


def sparkline(values: list) -> str:
    """Log-scale bars; a non-finite or missing value shows as '!'/' '."""
    finite = [abs(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v) and v != 0]
    if not finite:
        return ""
    lo, hi = math.log10(min(finite)), math.log10(max(finite))
    span = (hi - lo) or 1.0
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        elif not isinstance(v, (int, float)) or not math.isfinite(v):
            out.append("!")
        elif v == 0:
            out.append(_BARS[0])
        else:
            out.append(_BARS[min(7, int((math.log10(abs(v)) - lo) / span * 7.999))])
    return "".join(out)


def _history(history: History) -> Table | None:
    if len(history.steps) < 2:
        return None
    table = Table.grid(padding=(0, 1))
    table.add_column(style="bold")
    table.add_column()
    table.add_column(style="dim")
    for label, values in (("loss", history.loss), ("grad norm", history.grad_norm)):
        line = sparkline(values[-40:])
        if line:
            last = [v for v in values if v is not None][-3:]
            table.add_row(f"{label}:", line, "last: " + ", ".join(_num(v) for v in last))
    return table


def _num(v) -> str:
    if not isinstance(v, (int, float)) or not math.isfinite(v):
        return str(v)
    return f"{v:.3g}" if 1e-3 <= abs(v) < 1e5 or v == 0 else f"{v:.2e}"


# -- nandoctor check-data ---------------------------------------------------------------
# One table grouped by file, then a summary line. A file name may hold a newline or bytes
# that are not UTF-8: they are shown as escapes.


def data_renderables(report: DataReport) -> list[RenderableType]:
    table = [_table(report)] if report.problems else []
    return [*table, summary_line(report)]


def _table(report: DataReport) -> Table:
    table = Table(show_edge=False, pad_edge=False, expand=False)
    table.add_column("file", overflow="fold")
    table.add_column("key", overflow="fold")
    table.add_column("check", no_wrap=True)
    table.add_column("count", justify="right", no_wrap=True)
    table.add_column("detail", overflow="fold", ratio=1)
    for group in report.by_file().values():
        for i, problem in enumerate(group):
            table.add_row(
                _text(problem.file) if i == 0 else "",
                _text(problem.key) if problem.key is not None else "",
                _check(problem),
                f"{problem.count:,}",
                _text(problem.detail),
                end_section=i == len(group) - 1,
            )
    return table


def _check(problem: Problem) -> str:
    style = "bold red" if problem.is_error else "yellow"
    return f"[{style}]{escape(problem.check)}[/]"


def _text(value: str) -> str:
    return escape(printable(value))


def printable(value: str) -> str:
    """Control characters as escapes (a newline in a file name stays on one row), and bytes
    that are not UTF-8 (kept by Python as surrogates) as \\xNN."""
    value = decode_surrogates(value)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in value)


def summary_line(report: DataReport) -> str:
    files = _plural(report.files_scanned, "file")
    text = f"{files} checked"
    if report.problems:
        n_files = len(report.files_with_problems())
        counts = [_plural(len(report.errors), "error"), _plural(len(report.warnings), "warning")]
        text += (f", {_plural(len(report.problems), 'problem')} in {_plural(n_files, 'file')}"
                 f" ({', '.join(counts)})")
        style = "bold red" if report.errors else "yellow"
    else:
        text += ", no problems"
        style = "green"
    if report.files_skipped:
        text += f"; {_plural(report.files_skipped, 'file')} skipped (not a data format nandoctor reads)"
    return f"[{style}]{escape(text)}[/]"


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"
