"""Plain-text pieces that more than one format uses (and the pytest plugin's message)."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from nandoctor.report.model import Discarded, Location, Site, RunReport
from nandoctor.stats import one_line

if TYPE_CHECKING:
    from nandoctor.datacheck.model import Problem


def decode_surrogates(value: str) -> str:
    """File names that are not UTF-8 reach Python as lone surrogates, which UTF-8 cannot
    hold; they become \\xNN text instead."""
    try:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate that did not come from a file name
        return value.encode("utf-8", "backslashreplace").decode("utf-8")


def plural(n: int, word: str, many: str | None = None) -> str:
    """`1 optimizer step`, `2 optimizer steps`, `1,234 labels` (`many` for irregular plurals)."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"


def times(n: int) -> str:
    """`once`, `twice`, `12 times`."""
    return {1: "once", 2: "twice"}.get(n, f"{n:,} times")


def steps_done(step: int) -> str:
    """`after 25 optimizer steps`: how every report and note says when something happened.
    `step` counts the optimizer steps completed (the report's `step` field)."""
    return f"after {plural(step, 'optimizer step')}"


def shorten_path(path: str, width: int) -> str:
    """`path` in at most `width` characters, cut from the left at a folder boundary
    (`…/deep/train.py`), so the file name, the part a reader needs, always stays whole."""
    if len(path) <= width:
        return path
    parts = path.split("/")
    kept = parts[-1]
    for part in reversed(parts[:-1]):
        if len(part) + 1 + len(kept) + 2 > width:
            break
        kept = f"{part}/{kept}"
    short = f"…/{kept}"
    if len(short) <= width:
        return short
    return "…" + parts[-1][-max(width - 1, 1):]  # even the name is too long: its end


def fit_location(location: Location, width: int) -> str:
    """`file:line` in at most `width` characters: the path is shortened from the left
    (`…/deep/train.py:42`); the line number is never dropped."""
    suffix = f":{location.line}"
    return shorten_path(location.file, max(width - len(suffix), 1)) + suffix


# Sites of discarded values a clean run's summary names; more are counted (and listed in a note).
DISCARDED_LISTED = 3


def discarded_summary(discarded: list[Discarded], listed: int = DISCARDED_LISTED) -> str:
    """What a clean run made and threw away, in a sentence without its period: `Inf made 12
    times and discarded before it changed a parameter, at train.py:27
    (aten.log.default)`; values on lines the user allowed are said apart. '' for none."""
    phrases = []
    for allowed, what in ((False, "and discarded before it changed a parameter"),
                          (True, "on lines you allowed")):
        group = [d for d in discarded if d.allowed == allowed]
        if not group:
            continue
        made = {d.made for d in group}
        kind = "NaN and Inf" if len(made) > 1 else "NaN" if made == {"nan"} else "Inf"
        total = sum(d.count for d in group)
        sites = [_discarded_site(d, several=len(group) > 1) for d in group[:listed]]
        if len(group) > listed:
            sites.append(plural(len(group) - listed, "more place"))
        places = ", ".join(sites[:-1]) + " and " + sites[-1] if len(sites) > 1 else sites[0]
        phrases.append(f"{kind} made {times(total)} {what}, {places}")
    return "; ".join(phrases)


def _discarded_site(d: Discarded, several: bool) -> str:
    """`at train.py:27 (aten.log.default)`; with `several`, each site's count too."""
    op = d.op or "a value entering torch"
    if d.location is None:
        return f"in {op}" + (f" ({times(d.count)})" if several else "")
    return f"at {d.location} ({op}" + (f", {times(d.count)})" if several else ")")


# -- the run report ---------------------------------------------------------------------


def _where(site: Site) -> str:
    return str(site.location) if site.location else "an unknown location"


def _site_line(site: Site) -> str:
    op = site.op or "(no op: the value arrived non-finite)"
    parts = [f"{op} [{site.phase}] at {_where(site)}"]
    if site.backward_node:
        parts.append(f"backward node {site.backward_node}")
    if site.module:
        parts.append(f"module {site.module}")
    return ", ".join(parts)


def failure_message(report: RunReport) -> str:
    """`<cause title>: <root op> at <file>:<line>` — the one line CI systems show first."""
    title = report.cause.title if report.cause else "Non-finite value"
    root = report.root or report.event
    if root is None:
        return title
    return f"{title}: {root.op or '(no op)'} at {_where(root)}"


def failure_text(report: RunReport) -> str:
    """The plain-text story of a non-finite run: cause, fix, root, inputs, lineage.

    Used as the JUnit failure body and by the pytest plugin's failure message.
    """
    lines: list[str] = []
    cause = report.cause
    if cause is not None:
        lines.append(f"Cause: {cause.title} ({cause.id})")
        if cause.explanation:
            lines.append(cause.explanation)
        if cause.fix:
            lines.append(f"Fix: {cause.fix}")
        lines.append("")
    root = report.root or report.event
    if root is not None:
        lines.append(f"Root: {_site_line(root)}")
        if root.location is not None:
            lines.append(f"  in {root.location.function}: {root.location.code}")
        for summary in root.inputs:
            lines.append(f"  input  {one_line(summary)}")
        if root.output is not None:
            lines.append(f"  output {one_line(replace(root.output, name=''))}")
    if report.event is not None and report.event != root:
        reason = f" ({report.reason})" if report.reason else ""
        lines.append(f"Stopped at: {_site_line(report.event)}{reason}")
    if report.step is not None:
        lines.append(f"Stopped {steps_done(report.step)}.")
    if len(report.lineage) > 1:
        lines.append("Lineage (root first):")
        for i, site in enumerate(report.lineage, 1):
            lines.append(f"  {i}. {_site_line(site)}")
    return "\n".join(lines).strip("\n")


# -- the data report --------------------------------------------------------------------


def problem_line(problem: Problem) -> str:
    """`nan in 'x' (×3): 3 NaN values at (0, 1), ...` (key only when there is one)."""
    where = f" in {problem.key!r}" if problem.key is not None else ""
    head = f"{problem.check}{where}"
    if problem.count not in (0, 1):
        head += f" (×{problem.count})"
    return f"{head}: {problem.detail}" if problem.detail else head


def checks(problems: list[Problem]) -> str:
    """The checks the problems failed, each once: `nan, inf`."""
    return ", ".join(dict.fromkeys(p.check for p in problems))
