"""The data report: plain data that the scanner fills and the renderers read.

Nothing here imports numpy or torch, so the renderers stay light. `to_dict` gives the
contract's `nandoctor.data/1` shape; fields beyond the contract's are additions, never renames.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

SCHEMA = "nandoctor.data/1"
SKIPPED_LISTED = 100  # skipped files named in the report; the count is always whole

ERROR = "error"
WARNING = "warning"


@dataclass
class Problem:
    """One finding: which file, which array in it, which check, how many, and where."""

    file: str
    key: str | None
    check: str
    count: int
    detail: str
    positions: list[tuple[int, ...]] = field(default_factory=list)
    severity: str = ERROR

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "key": self.key,
            "check": self.check,
            "count": int(self.count),
            "detail": self.detail,
            "severity": self.severity,
            "positions": [list(p) for p in self.positions],
        }


@dataclass
class DataReport:
    files_scanned: int = 0
    files_skipped: int = 0  # files with an extension no reader knows: not problems
    problems: list[Problem] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # those files (the first SKIPPED_LISTED)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == ERROR]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == WARNING]

    @property
    def status(self) -> str:
        # Follows the exit status: warnings alone (constant, fp16_range) leave the data "clean".
        return "problems" if self.errors else "clean"

    def files_with_problems(self) -> list[str]:
        return list(self.by_file())

    def by_file(self) -> dict[str, list[Problem]]:
        """The problems grouped by file, files in order of first appearance."""
        groups: dict[str, list[Problem]] = {}
        for problem in self.problems:
            groups.setdefault(problem.file, []).append(problem)
        return groups

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "status": self.status,
            "files_scanned": self.files_scanned,
            "files_skipped": self.files_skipped,
            "skipped_files": list(self.skipped),
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "problems": [p.to_dict() for p in self.problems],
        }


def apply_severity(problems: Iterable[Problem], error_checks: Sequence[str],
                   warning_checks: Sequence[str] | None = None) -> list[Problem]:
    """Mark each problem error or warning from the config's `check_data.errors` and
    `check_data.warnings` lists; a check in neither list is silenced (not reported).
    Without a warnings list, everything that is not an error is a warning."""
    marked = []
    for problem in problems:
        if problem.check in error_checks:
            problem.severity = ERROR
        elif warning_checks is None or problem.check in warning_checks:
            problem.severity = WARNING
        else:
            continue
        marked.append(problem)
    return marked
