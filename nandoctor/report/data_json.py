"""The data report as JSON (`check-data --json PATH`), schema `nandoctor.data/1`."""
from __future__ import annotations

import json
from typing import Any

from nandoctor.datacheck.model import DataReport
from nandoctor.errors import UsageError


def to_json(report: DataReport) -> str:
    return json.dumps(_utf8_safe(report.to_dict()), indent=2, ensure_ascii=False) + "\n"


def write_json(report: DataReport, path: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(to_json(report))
    except OSError as exc:
        raise UsageError(f"cannot write the JSON report to {path}: {exc.strerror}") from None


def _utf8_safe(value: Any) -> Any:
    """File names that are not UTF-8 reach Python as lone surrogates, which UTF-8 JSON cannot
    hold; they are written as \\xNN text instead."""
    if isinstance(value, str):
        return _decode_surrogates(value)
    if isinstance(value, dict):
        return {k: _utf8_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_utf8_safe(v) for v in value]
    return value


def _decode_surrogates(value: str) -> str:
    try:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate that did not come from a file name
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
