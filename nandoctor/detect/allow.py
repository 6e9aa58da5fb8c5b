"""Lines and ops the user accepts as making non-finite values on purpose.

Two ways, both reported: a `# nandoctor: allow` comment on the line (like `# noqa`), and
the config's `run.allow` list, whose entries are `file:line` (`train.py:27`, matched
against the end of the file's path) or an op pattern (`aten.log.*`, fnmatch-style). A value
made on an accepted line is treated like a `-inf` mask written on purpose: it is never a
root and never stops the run by itself (a loss it makes non-finite still does).
"""
from __future__ import annotations

import fnmatch
import linecache
import re
import types

_COMMENT = re.compile(r"#.*\bnandoctor:\s*allow\b")
_FILE_LINE = re.compile(r"^(.+):(\d+)$")


class Allowances:
    def __init__(self, entries=()) -> None:
        self._lines: list[tuple[str, int]] = []
        self._ops: list[str] = []
        for entry in entries:
            match = _FILE_LINE.match(entry)
            if match:
                self._lines.append((match.group(1).replace("\\", "/"), int(match.group(2))))
            else:
                self._ops.append(entry)
        self._by_site: dict[tuple[types.CodeType, int], bool] = {}

    def accepts(self, op: str, where: tuple[types.CodeType, int] | None) -> bool:
        if any(fnmatch.fnmatchcase(op, pattern) for pattern in self._ops):
            return True
        if where is None:
            return False
        known = self._by_site.get(where)
        if known is None:
            known = self._by_site[where] = self._line_accepted(*where)
        return known

    def _line_accepted(self, code: types.CodeType, line: int) -> bool:
        filename = code.co_filename.replace("\\", "/")
        if any(line == n and (filename == f or filename.endswith("/" + f)) for f, n in self._lines):
            return True
        return bool(_COMMENT.search(linecache.getline(code.co_filename, line)))
