"""Both reports as JSON (`--json PATH`): exactly the models' `to_dict()`, the contract's
shapes (`nandoctor.run/1`, `nandoctor.data/1`) plus added fields."""
from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from nandoctor.report.model import RunReport
from nandoctor.report.text import decode_surrogates

if TYPE_CHECKING:
    from nandoctor.datacheck.model import DataReport


class Json:
    def render_run(self, report: RunReport) -> str:
        return _dumps(report.to_dict(), ensure_ascii=True)

    def render_data(self, report: DataReport) -> str:
        # Non-ASCII file names stay readable in the data report.
        return _dumps(report.to_dict(), ensure_ascii=False)


def _dumps(data: dict[str, Any], ensure_ascii: bool) -> str:
    return json.dumps(_json_safe(data), indent=2, allow_nan=False, ensure_ascii=ensure_ascii) + "\n"


def _json_safe(value: Any) -> Any:
    """JSON has no NaN/Inf: non-finite floats (a NaN loss in the history) become strings.
    Names that are not UTF-8 (lone surrogates) become \\xNN text."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if value != value else ("inf" if value > 0 else "-inf")
    if isinstance(value, str):
        return decode_surrogates(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value
