"""One-line tensor summaries: shape, dtype, finite range and counts of the values that matter.

Computed only on the rare path (a non-finite value was found), so they can afford exact
counts. Shared by the run report and the data checker.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where tensors are summarised, not by the report model
    import torch


@dataclass(frozen=True)
class TensorSummary:
    name: str
    shape: tuple[int, ...]
    dtype: str
    min: float | None  # over the finite elements; None when there are none
    max: float | None
    nan: int
    posinf: int
    neginf: int
    zeros: int
    negatives: int
    numel: int = 0
    # a few positions of the first non-finite elements (index tuples), for the report
    first_nonfinite: tuple[tuple[int, ...], ...] = ()

    @property
    def nonfinite(self) -> int:
        return self.nan + self.posinf + self.neginf

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["shape"] = list(self.shape)
        data["first_nonfinite"] = [list(p) for p in self.first_nonfinite]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TensorSummary":
        data = dict(data)
        data["shape"] = tuple(data.get("shape") or ())
        data["first_nonfinite"] = tuple(tuple(p) for p in data.get("first_nonfinite") or ())
        return cls(**data)


def _dtype_name(dtype: "torch.dtype") -> str:
    return str(dtype).removeprefix("torch.")


def summarize(tensor: "torch.Tensor", name: str = "", positions: int = 3) -> TensorSummary:
    """Exact summary of `tensor` (any device, any dtype); never changes it."""
    import torch

    from nandoctor.detect.records import stored_values

    with torch.no_grad():
        t = stored_values(tensor.detach())  # (sparse: the values it stores, with no dense copy)
        if t.is_complex():
            t = torch.view_as_real(t)
        shape = tuple(tensor.shape)
        dtype = _dtype_name(tensor.dtype)
        if t.numel() == 0:
            return TensorSummary(name, shape, dtype, None, None, 0, 0, 0, 0, 0, 0)
        if t.dtype == torch.bool:
            t = t.to(torch.uint8)
        if not t.is_floating_point():
            lo, hi = t.min().item(), t.max().item()
            zeros = int((t == 0).sum().item())
            neg = int((t < 0).sum().item())
            return TensorSummary(name, shape, dtype, lo, hi, 0, 0, 0, zeros, neg, t.numel())
        t = t.float() if t.dtype in (torch.float16, torch.bfloat16) or t.element_size() < 4 else t
        if type(t) is torch.Tensor and t.device.type == "cpu":
            return _summarize_array(t.numpy(), name, shape, dtype, positions)
        nan_mask = torch.isnan(t)
        pos_mask = torch.isposinf(t)
        neg_mask = torch.isneginf(t)
        finite = ~(nan_mask | pos_mask | neg_mask)
        finite_values = t[finite]
        lo = finite_values.min().item() if finite_values.numel() else None
        hi = finite_values.max().item() if finite_values.numel() else None
        bad_positions = ()
        if not bool(finite.all()):
            idx = (~finite).nonzero()[:positions].tolist()
            bad_positions = tuple(tuple(int(i) for i in p) for p in idx)
        return TensorSummary(
            name=name,
            shape=shape,
            dtype=dtype,
            min=lo,
            max=hi,
            nan=int(nan_mask.sum().item()),
            posinf=int(pos_mask.sum().item()),
            neginf=int(neg_mask.sum().item()),
            zeros=int((t == 0).sum().item()),
            negatives=int((t < 0).sum().item()),
            numel=t.numel(),
            first_nonfinite=bad_positions,
        )


def _summarize_array(a, name: str, shape: tuple, dtype: str, positions: int) -> TensorSummary:
    """`summarize` of a CPU tensor's values, through numpy: the same numbers, in a fraction
    of the time (no dispatch per reduction; records are made on a running training step)."""
    import numpy as np

    finite = np.isfinite(a)
    all_finite = bool(finite.all())
    finite_values = a if all_finite else a[finite]
    lo = float(finite_values.min()) if finite_values.size else None
    hi = float(finite_values.max()) if finite_values.size else None
    bad_positions = ()
    if not all_finite:
        bad_positions = tuple(tuple(int(i) for i in p) for p in np.argwhere(~finite)[:positions].tolist())
    return TensorSummary(
        name=name, shape=shape, dtype=dtype, min=lo, max=hi,
        nan=int(np.count_nonzero(np.isnan(a))), posinf=int(np.count_nonzero(np.isposinf(a))),
        neginf=int(np.count_nonzero(np.isneginf(a))), zeros=int(np.count_nonzero(a == 0)),
        negatives=int(np.count_nonzero(a < 0)), numel=int(a.size), first_nonfinite=bad_positions,
    )


def summarize_number(value: float, name: str = "") -> TensorSummary:
    """A Python number an op received where it takes a tensor (`x / 0`, `x * 0.5`)."""
    import math

    finite = math.isfinite(value)
    return TensorSummary(
        name=name, shape=(), dtype=type(value).__name__, min=value if finite else None, max=value if finite else None,
        nan=int(value != value), posinf=int(value == math.inf), neginf=int(value == -math.inf),
        zeros=int(value == 0), negatives=int(value < 0), numel=1,
    )


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0 or 1e-3 <= abs(x) < 1e5:
        return f"{x:.4g}"
    return f"{x:.3e}"


def one_line(s: TensorSummary) -> str:
    """`self f32[64] x∈[-0.9998, 1.0000001] zeros=3 neg=31 NaN×2` (pieces only when they add something)."""
    shape = "[" + ", ".join(str(d) for d in s.shape) + "]"
    head = f"{s.name + ' ' if s.name else ''}{s.dtype}{shape}"
    parts = [head]
    if s.numel == 0:
        return head + " empty"
    parts.append(f"x∈[{_fmt(s.min)}, {_fmt(s.max)}]" if s.min is not None else "no finite values")
    if s.zeros:
        parts.append(f"zeros={s.zeros}")
    if s.negatives:
        parts.append(f"neg={s.negatives}")
    for label, count in (("NaN", s.nan), ("+Inf", s.posinf), ("-Inf", s.neginf)):
        if count:
            parts.append(f"{label}×{count}")
    return " ".join(parts)
