"""The data report for people: one table grouped by file, then a summary line.

User strings (file names, keys, details) are escaped for rich markup and made printable:
a file name may hold a newline or bytes that are not UTF-8.
"""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nandoctor.datacheck.model import ERROR, DataReport, Problem


def render(report: DataReport, console: Console) -> None:
    if report.problems:
        console.print(_table(report.problems))
    console.print(summary_line(report))


def _table(problems: list[Problem]) -> Table:
    table = Table(show_edge=False, pad_edge=False, expand=False)
    table.add_column("file", overflow="fold")
    table.add_column("key", overflow="fold")
    table.add_column("check", no_wrap=True)
    table.add_column("count", justify="right", no_wrap=True)
    table.add_column("detail", overflow="fold", ratio=1)
    for group in _by_file(problems):
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


def _by_file(problems: list[Problem]) -> list[list[Problem]]:
    groups: dict[str, list[Problem]] = {}
    for problem in problems:
        groups.setdefault(problem.file, []).append(problem)
    return list(groups.values())


def _check(problem: Problem) -> str:
    style = "bold red" if problem.severity == ERROR else "yellow"
    return f"[{style}]{escape(problem.check)}[/]"


def _text(value: str) -> str:
    return escape(printable(value))


def printable(value: str) -> str:
    """Control characters as escapes (a newline in a file name stays on one row), and bytes
    that are not UTF-8 (kept by Python as surrogates) as \\xNN."""
    value = _decode_surrogates(value)
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


def _decode_surrogates(value: str) -> str:
    try:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate that did not come from a file name
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
