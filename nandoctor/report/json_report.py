"""The run report as JSON (`--json PATH`), exactly the contract's shape plus added fields."""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from nandoctor.errors import UsageError
from nandoctor.report.model import RunReport


def _jsonable(value: Any) -> Any:
    """JSON has no NaN/Inf: non-finite floats (a NaN loss in the history) become strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if value != value else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def render_json(report: RunReport) -> str:
    return json.dumps(_jsonable(report.to_dict()), indent=2, allow_nan=False)


def write_json(text: str, path: str | Path) -> None:
    """Write atomically, so a reader never sees half a report (also on Ctrl-C)."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise UsageError(f"cannot write report to {path}: {exc.strerror or exc}") from None


def check_writable(path: str | Path) -> None:
    """Fail before the script runs, not after hours of training, when --json can't be written."""
    folder = Path(path).parent if str(Path(path).parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"cannot write report to {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"cannot write report to {path}: folder {folder} is not writable")
