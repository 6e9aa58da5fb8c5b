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

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.markup import escape
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from nandoctor.report.model import History, Location, Site, RunReport, SiteFacts
from nandoctor.report.text import decode_surrogates, discarded_summary, fit_location, plural, steps_done
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
                # A path is printed whole, never wrapped or cropped, so it can be copied.
                self.console.print(renderable, soft_wrap=isinstance(renderable, WholeLine))
        return _encodable(captured.get(), self.console.encoding)


# A stream that cannot write the report's own marks (`LC_ALL=C` in a bare container: ASCII)
# gets one ASCII character for each, so the columns and the frame still line up (rich
# draws the frame itself in ASCII there).
_ASCII_MARKS = str.maketrans("│→∈×─—–…▁▂▃▄▅▆▇█", "|>=x---._.-=+*##")


def _encodable(text: str, encoding: str) -> str:
    try:
        text.encode(encoding)
        return text
    except UnicodeEncodeError:
        return text.translate(_ASCII_MARKS).encode(encoding, "replace").decode(encoding)
    except LookupError:  # an encoding Python does not know: leave it to the stream
        return text


class WholeLine(Text):
    """A line printed as it is, however narrow the console: a file name to copy."""


# -- nandoctor run ----------------------------------------------------------------------


def run_renderable(report: RunReport, context_lines: int = 2) -> RenderableType:
    if report.status == "nonfinite":
        return NonfiniteReport(report, context_lines)
    if report.status == "script_error":
        return _script_error(report)
    return _clean(report)


def _clean(report: RunReport) -> Text:
    why = " (stopped at --max-steps)" if report.stopped_by == "max_steps" else ""
    seen = discarded_summary(report.discarded)
    if not seen:
        steps = f" over {plural(report.step, 'optimizer step')}" if report.step is not None else ""
        # Watch mode looks at the step's boundaries only: say what it vouches for (a loss
        # or gradients the script tested and skipped never reached a step).
        seen_in = "the losses, gradients or parameters that reached an optimizer step of " \
            if report.mode == "watch" else ""
        text = Text.from_markup(
            f"[bold green]nandoctor: clean[/] — no NaN or Inf in {seen_in}{escape(report.script)}{steps}{why}; "
            f"the script exited {report.exit_code}."
        )
    else:  # say what was seen: where NaN/Inf were made, and that none of them mattered
        steps = f"ran {plural(report.step, 'optimizer step')}{why} and " if report.step is not None else ""
        text = Text.from_markup(
            f"[bold green]nandoctor: clean[/] — {escape(report.script)} {steps}exited {report.exit_code}. "
            f"{escape(seen[0].upper() + seen[1:])}."
        )
    return _with_notes(text, report)


def _with_notes(text: Text, report: RunReport) -> Text:
    for note in report.notes:
        text.append_text(Text.from_markup(f"\n[dim]note:[/] {escape(note)}"))
    return text


def _script_error(report: RunReport) -> Text:
    err = report.error or {}
    how = f"was stopped by {err['signal']}" if err.get("signal") else f"raised {err.get('type', 'an exception')}"
    text = Text.from_markup(
        f"[bold yellow]nandoctor: the script {escape(how)}[/] "
        f"(exit {report.exit_code}); no NaN or Inf was seen before it"
        + (f" ({steps_done(report.step)})." if report.step is not None else ".")
    )
    return _with_notes(text, report)


@dataclass(frozen=True)
class NonfiniteReport:
    """The boxed report of a non-finite run, laid out for the width it is rendered at: the
    headline keeps its `file:line` (the path shortened from the left) at 80 columns too."""

    report: RunReport
    context_lines: int = 2

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield _nonfinite(self.report, self.context_lines, options.max_width)


# The panel's frame: `╭─ title ─╮` around the title, `│ ` and ` │` around each line.
_TITLE_FRAME = 6
_BODY_FRAME = 4


def _nonfinite(report: RunReport, context_lines: int, width: int = 120) -> Panel:
    root, event, cause = report.root, report.event, report.cause
    assert root is not None and event is not None
    parts: list = []
    if cause is not None:
        parts.append(Text.from_markup(f"[bold]{escape(cause.title)}[/]  [dim]({escape(cause.id)})[/]"))
        parts.append(Text(cause.explanation))
        if cause.fix:
            parts.append(Text.from_markup(f"[bold green]Fix:[/] {escape(cause.fix)}"))
        parts.append(Text(""))
    body = max(width - _BODY_FRAME, 20)
    parts.append(_site_heading("Root", root, body))
    parts.append(_source(root.location, context_lines))
    parts.append(_tensors(root))
    if len(report.lineage) > 1:
        parts.append(Text(""))
        parts.append(_lineage(report.lineage, body))
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
    if report.step is not None:
        parts.insert(0, Text(steps_done(report.step), style="dim"))
    title = Text(_headline(event, root, width - _TITLE_FRAME), style="bold red")
    return Panel(Group(*parts), title=title, title_align="left", border_style="red", expand=False)


def _headline(event: Site, root: Site, width: int) -> str:
    """`nandoctor: NaN in forward at …/deep/train.py:42` (what the run stopped on, where
    its root was made; `NaN from an Inf in forward` when the root made the other kind), in
    at most `width` characters
    when it can be: the path is shortened from the left and, on a very narrow console, the
    words before it go, but the file name and line number stay."""
    kind = _kind(event)
    if root.made and event.made and root.made != event.made:  # (a log's -inf that became a NaN gradient)
        kind = f"{kind} from {'an Inf' if root.made == 'inf' else 'a NaN'}"
    heads = [f"nandoctor: {kind} in {root.phase}", f"nandoctor: {kind}", kind]
    if root.location is None:
        return heads[0]
    name = f"{root.location.file.rsplit('/', 1)[-1]}:{root.location.line}"  # what must stay whole
    head = next((h for h in heads if width - len(h) - 4 >= len(name) + 2), heads[-1])
    return f"{head} at {fit_location(root.location, max(width - len(head) - 4, 4))}"


def _watch_line(report: RunReport) -> Text:
    weights = {True: "[green]the trained weights are still finite: no update was made from a non-finite value[/]",
               False: "[red]weights already non-finite[/]", None: "weights not checked (no optimizer seen)"}
    replay = {True: "reproduced under --mode trace", False: "[yellow]NOT reproduced on replay[/]", None: ""}
    bits = [b for b in (weights[report.weights_clean], replay[report.reproduced]) if b]
    return Text.from_markup("[bold]Watch mode:[/] " + "; ".join(bits))


def _kind(site: Site) -> str:
    return {"nan": "NaN", "inf": "Inf"}.get(site.made, "non-finite value")


def _site_heading(label: str, site: Site, width: int = 120) -> Text:
    op = site.op or ("(no torch op: made by numpy)" if site.facts.made_by_numpy else "(no op: value arrived non-finite)")
    bits = [f"[bold]{label}:[/] [cyan]{escape(op)}[/]", f"phase {site.phase}"]
    if site.backward_node:
        bits.append(f"backward of [cyan]{escape(site.backward_node)}[/]")
    if site.module:
        bits.append(f"module [magenta]{escape(site.module)}[/]")
    if site.location:
        bits.append(f"at {escape(fit_location(site.location, width - 3))} in {escape(site.location.function)}")
    return Text.from_markup("  ".join(bits))


def _source(location: Location | None, context: int) -> RenderableType:
    """The culprit line marked, with `context` lines around it. A line too long for the
    width wraps inside the code column, under the code, not back at the left edge."""
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
    table = Table.grid(padding=(0, 1), pad_edge=False)
    table.add_column(no_wrap=True)  # "  →"
    table.add_column(justify="right", no_wrap=True)
    table.add_column(no_wrap=True)  # "│"
    table.add_column(overflow="fold")
    for n, text in lines:
        mark = "  →" if n == location.line else "   "
        style = "bold" if n == location.line else "dim"
        table.add_row(mark, f"{n:>4}", "│", Text(text.expandtabs(4)), style=style)
    return Group(table, Text(""))


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
        frozen = "" if p.trained else " (requires_grad=False)"
        rows.append(("buffer" if p.buffer else "parameter", (p.name or f"{where}shape {_numbers(p.shape)}") + frozen))
    if facts.optimizer:
        rows.append(("optimizer", facts.optimizer))
    b = facts.batch
    if b is not None:
        rows.append(("batch", f"{b.number}, {b.key}, rows {_numbers(b.rows)}"
                     + (f", dataset indices {_numbers(b.dataset_indices)}" if b.dataset_indices else "")))
    if facts.inf_written_at is not None or facts.inf_written_by:
        rows.append(("Inf written at", str(facts.inf_written_at or facts.inf_written_by)))
    ctc = facts.ctc
    if ctc is not None:
        rows.append(("CTC lengths", f"input {_numbers(ctc.input_lengths)}, target {_numbers(ctc.target_lengths)}"))
    if facts.exponent is not None:
        rows.append(("exponent", f"{facts.exponent:g}"))
    if facts.loss is not None or facts.grad_norm is not None:
        rows.append(("at the boundary", f"loss {_maybe(facts.loss)}, gradient norm {_maybe(facts.grad_norm)}"))
    if facts.op_facts_error:
        rows.append(("op facts unavailable", facts.op_facts_error))
    return rows


def _numbers(values, shown: int = 8) -> str:
    """`[12, 16, 14]`; a long list keeps its first `shown` values and says how many there are."""
    values = list(values)
    if len(values) <= shown:
        return "[" + ", ".join(str(v) for v in values) + "]"
    return "[" + ", ".join(str(v) for v in values[:shown]) + f", … ({len(values)} in all)]"


def _maybe(value) -> str:
    return "not seen" if value is None else _num(value)


def _tensor_line(line: str, bad: int) -> Text:
    text = Text(line)
    for word in ("NaN×", "+Inf×", "-Inf×"):
        start = line.find(word)
        if start >= 0:
            end = line.find(" ", start)
            text.stylize("bold red", start, end if end > 0 else len(line))
    return text


def _lineage(lineage: list[Site], width: int = 120) -> Table:
    """One row per site, root first. A location is never broken: it is shortened from the
    left instead (`…/losses.py:9`); the module column only when some site ran in one."""
    root_file = lineage[0].location.file if lineage and lineage[0].location else None
    ops = [(site.op + (f" ({site.backward_node})" if site.backward_node else "")) or "-" for site in lineage]
    columns = {
        "#": [str(i) for i in range(1, len(lineage) + 1)],
        "op": [escape(op) for op in ops],
        "phase": [site.phase for site in lineage],
        "line": [],
        "module": [escape(site.module or "-") for site in lineage],
        "output": [_counts(site) for site in lineage],
    }
    if not any(site.module for site in lineage):
        del columns["module"]
    # The line column gets what the other columns leave (2 characters of padding each),
    # and at least `…/file_name.py:123`: op names and modules fold before a file name breaks.
    others = sum(min(max(len(name), *(len(v) for v in values)), 16 if name == "module" else 10**6)
                 for name, values in columns.items() if name != "line") + 2 * len(columns)
    names = [len(f"{s.location.file.rsplit('/', 1)[-1]}:{s.location.line}") + 2 for s in lineage
             if s.location is not None and s.location.file != root_file]
    line_width = min(max(width - others, 20, *names), 60)
    columns["line"] = [escape(_short_location(s.location, root_file, line_width)) for s in lineage]

    table = Table(title="Lineage (root → where it stopped)", title_justify="left", show_edge=False, box=None, padding=(0, 1))
    for name in columns:
        wrap = {"overflow": "fold"} if name in ("op", "module") else {"no_wrap": True}
        table.add_column(name, style="dim" if name == "#" else None, **wrap)
    rows = list(zip(*columns.values()))
    if len(rows) > LINEAGE_SHOWN:
        # A loop unrolled op by op (Sinkhorn's iterations) would fill the screen: its ends
        # tell the story; the JSON report keeps every row.
        head, tail = LINEAGE_SHOWN // 2, LINEAGE_SHOWN - LINEAGE_SHOWN // 2
        gap = [""] * len(columns)
        gap[1] = f"… {len(rows) - head - tail} more ops (every one in the JSON report)"
        rows = rows[:head] + [tuple(gap)] + rows[-tail:]
    for row in rows:
        cells = list(row)
        if cells[-1]:
            cells[-1] = _tensor_line(cells[-1], 1)
        table.add_row(*cells)
    return table


LINEAGE_SHOWN = 16  # lineage rows the terminal shows at most: the first 8 and the last 8


def _short_location(location: Location | None, root_file: str | None, width: int = 40) -> str:
    """`21` in the root's file, `losses.py:9` elsewhere (shortened from the left to `width`)."""
    if location is None:
        return "-"
    return str(location.line) if location.file == root_file else fit_location(location, width)


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
# The problems grouped by file: each file's path on a line of its own, whole (never wrapped
# or cut, so it can be copied, also 80 columns wide), its problems below it in columns that
# line up across files, then a summary line. A file name may hold a newline or bytes that
# are not UTF-8: they are shown as escapes.

_KEY_WIDTH = 28  # a longer key (`['model']['encoder.layers.0.weight']`) wraps in its column


def data_renderables(report: DataReport) -> list[RenderableType]:
    return [*_problem_blocks(report), summary_line(report)]


def _problem_blocks(report: DataReport) -> list[RenderableType]:
    if not report.problems:
        return []
    has_key = any(p.key is not None for p in report.problems)
    widths = {
        "severity": max(len("severity"), *(len(p.severity) for p in report.problems)),
        "check": max(len("check"), *(len(p.check) for p in report.problems)),
        "key": min(_KEY_WIDTH, max(len("key"), *(len(printable(p.key or "")) for p in report.problems))),
        "count": max(len("count"), *(len(f"{p.count:,}") for p in report.problems)),
    }
    blocks: list[RenderableType] = [Padding(_problem_table(widths, has_key, header=True), (0, 0, 0, 2))]
    for name, group in report.by_file().items():
        blocks.append(WholeLine(printable(name), style="bold"))
        table = _problem_table(widths, has_key, header=False)
        for problem in group:
            cells = [_severity(problem), _check(problem)]
            if has_key:
                cells.append(_text(problem.key) if problem.key is not None else "")
            cells += [f"{problem.count:,}", _text(problem.detail)]
            table.add_row(*cells)
        blocks.append(Padding(table, (0, 0, 0, 2)))
    return blocks


def _problem_table(widths: dict[str, int], has_key: bool, header: bool) -> Table:
    """One file's rows (or, with `header`, the column names alone): the same fixed widths
    for every file, so the columns line up; the detail takes the rest of the line."""
    table = Table(box=None, show_header=header, show_edge=False, pad_edge=False, padding=(0, 1),
                  expand=True, header_style="bold")
    table.add_column("severity", width=widths["severity"], no_wrap=True)
    table.add_column("check", width=widths["check"], no_wrap=True)
    if has_key:
        table.add_column("key", width=widths["key"], overflow="fold")
    table.add_column("count", width=widths["count"], justify="right", no_wrap=True)
    table.add_column("detail", ratio=1, overflow="fold")
    return table


def _severity(problem: Problem) -> str:
    style = "bold red" if problem.is_error else "yellow"
    return f"[{style}]{escape(problem.severity)}[/]"


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


_SKIPPED_NAMED = 3  # skipped files named on the summary line (the JSON lists more)


def summary_line(report: DataReport) -> str:
    files = plural(report.files_scanned, "file")
    text = f"{files} checked"
    if report.problems:
        n_files = len(report.files_with_problems())
        counts = [plural(len(report.errors), "error"), plural(len(report.warnings), "warning")]
        text += (f", {plural(len(report.problems), 'problem')} in {plural(n_files, 'file')}"
                 f" ({', '.join(counts)})")
        style = "bold red" if report.errors else "yellow"
    else:
        text += ", no problems"
        style = "green"
    if report.files_skipped:
        named = report.skipped[:_SKIPPED_NAMED]
        which = f": {', '.join(named)}{', ...' if report.files_skipped > len(named) else ''}" if named else ""
        text += f"; {plural(report.files_skipped, 'file')} skipped (not a data format nandoctor reads{which})"
    return f"[{style}]{escape(text)}[/]"

