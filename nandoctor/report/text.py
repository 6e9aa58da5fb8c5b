"""Plain-text pieces that more than one format uses (and the pytest plugin's message)."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from nandoctor.report.model import Site, RunReport
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
        lines.append(f"Optimizer steps completed: {report.step}")
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
