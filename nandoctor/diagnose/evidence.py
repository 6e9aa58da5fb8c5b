"""What a rule looks at: the detection's root, event and lineage and the run's history,
with the questions rules keep asking (how many zeros went into the division? which dtype?).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from nandoctor.detect.result import OVERWRITTEN_SUFFIX, Detection, History, Site, SiteFacts
from nandoctor.stats import TensorSummary

# Largest x whose exp(x) is finite, per dtype (log of the dtype's max).
EXP_LIMIT = {"float32": 88.72, "float16": 11.09, "bfloat16": 88.72, "float64": 709.78}
FLOAT_MAX = {"float32": 3.4028e38, "float16": 65504.0, "bfloat16": 3.3895e38, "float64": 1.7977e308}


@dataclass
class Evidence:
    root: Site
    event: Site
    lineage: list[Site]
    history: History
    step: int | None

    @classmethod
    def of(cls, detection: Detection, history: History, step: int | None) -> "Evidence":
        return cls(detection.root, detection.event, detection.lineage, history, step)

    @property
    def facts(self) -> SiteFacts:
        """The root's facts."""
        return self.root.facts

    @property
    def op(self) -> str:
        """Base name of the root op, in-place variants as their op: `aten.log_.default` -> `log`."""
        parts = self.root.op.split(".")
        name = parts[1] if len(parts) >= 2 else self.root.op
        return name[:-1] if name.endswith("_") and not name.endswith("__") else name

    @property
    def node(self) -> str | None:
        """The autograd node whose built-in formula ran the root op; None for a forward root
        and for an op the user's own backward code called (it is judged as the op it is)."""
        return None if self.root.facts.user_backward else self.root.backward_node

    @property
    def forward_op(self) -> str | None:
        """For a backward root, the forward op its node differentiates: `SqrtBackward0` -> `sqrt`."""
        if not self.node:
            return None
        name = self.node.rstrip("0123456789")
        name = name[: -len("Backward")] if name.endswith("Backward") else name
        # CamelCase as torch spells the op: SpecialEntr -> special_entr, LogSoftmax -> log_softmax
        return re.sub(r"(?<=[a-z])(?=[A-Z])", "_", name).lower()

    @property
    def where(self) -> str:
        loc = self.root.location
        return f"{loc.file}:{loc.line}" if loc else "an unknown line"

    @property
    def code(self) -> str:
        loc = self.root.location
        return f"`{loc.code}`" if loc and loc.code else "this line"

    @property
    def output(self) -> TensorSummary | None:
        return self.root.output

    @property
    def dtype(self) -> str:
        return self.output.dtype if self.output else "float32"

    def input(self, *names: str) -> TensorSummary | None:
        for s in self.root.inputs:
            if s.name in names:
                return s
        return None

    def first_input(self) -> TensorSummary | None:
        return self.root.inputs[0] if self.root.inputs else None

    def inputs_finite(self) -> bool:
        """Were the inputs finite when the op received them? (An in-place op's `self` too
        large to keep a copy of is summarised after the op: it says nothing about before.)"""
        return all(s.nonfinite == 0 for s in self.root.inputs if not s.name.endswith(OVERWRITTEN_SUFFIX))

    def made_nan(self) -> bool:
        return bool(self.output and self.output.nan)

    def made_inf(self) -> bool:
        return bool(self.output and (self.output.posinf or self.output.neginf))


def fmt(x: float | None) -> str:
    if x is None:
        return "none"
    if x == 0:
        return "0.0"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if 1e-3 <= abs(x) < 1e5:
        return f"{x:.4g}"
    return f"{x:.3e}"


def count_of(n: int, summary: TensorSummary | None) -> str:
    total = summary.numel if summary else 0
    return f"{n} of {total}" if total else str(n)
