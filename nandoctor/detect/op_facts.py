"""Op-specific facts gathered when an op turns out to be the root of a non-finite value.

Collected on the rare path while the op's arguments are still live (CTC's lengths, a
Python-number exponent); the diagnosis rules read them later from `SiteFacts`. A
collector returns keyword arguments of `SiteFacts`; registering an op twice is an error.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from nandoctor.detect.ops import SOFTMAX_OPS, base_name
from nandoctor.detect.result import CtcItem, CtcLengths

_collectors: dict[str, Callable[..., dict[str, Any]]] = {}


def collects(*op_names: str):
    """Register a fact collector for ops by base name (`_ctc_loss`, ...)."""

    def register(fn):
        for name in op_names:
            if name in _collectors:
                raise ValueError(f"facts for {name} registered twice")
            _collectors[name] = fn
        return fn

    return register


def collect_op_facts(func, args, kwargs) -> dict[str, Any]:
    collector = _collectors.get(base_name(func))
    if collector is None:
        return {}
    try:
        return collector(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - facts are a bonus; never break detection
        return {"op_facts_error": f"{type(exc).__name__}: {exc}"}


def _lengths(value) -> tuple[int, ...]:
    if isinstance(value, torch.Tensor):
        return tuple(int(v) for v in value.flatten().tolist())
    return tuple(int(v) for v in value)


@collects("_ctc_loss", "ctc_loss")
def ctc_facts(log_probs, targets, input_lengths, target_lengths, blank=0, *rest, **kwargs) -> dict[str, Any]:
    """Which batch items cannot be aligned: CTC needs T >= L + (number of repeated labels)."""
    ins, outs = _lengths(input_lengths), _lengths(target_lengths)
    flat = targets.dim() == 1
    impossible = []
    offset = 0
    for i, (t_len, l_len) in enumerate(zip(ins, outs)):
        labels = targets[offset: offset + l_len] if flat else targets[i, :l_len]
        offset += l_len if flat else 0
        labels = labels.tolist()
        repeats = sum(1 for a, b in zip(labels, labels[1:]) if a == b)
        if t_len < l_len + repeats:
            impossible.append(CtcItem(i, t_len, l_len, repeats))
    return {"ctc": CtcLengths(ins, outs, tuple(impossible))}


@collects("pow", "pow_", "float_power")
def pow_facts(base, exponent, *rest, **kwargs) -> dict[str, Any]:
    """A Python-number exponent is not a tensor input: keep it for the rule."""
    if isinstance(exponent, (int, float)):
        return {"exponent": float(exponent)}
    return {}


@collects("nll_loss_forward", "nll_loss2d_forward")
def nll_loss_facts(log_probs, target, weight=None, reduction=1, ignore_index=-100, *rest, **kwargs) -> dict[str, Any]:
    """How many targets the mean counts: none (all `ignore_index`, or all of weight 0) is 0/0."""
    counted = target != ignore_index
    if weight is not None:
        counted &= weight[target.clamp(0, weight.numel() - 1)] != 0
    return {"ignore_index": int(ignore_index), "counted_targets": int(counted.sum())}


@collects("mean")
def mean_facts(x, dim=None, *rest, **kwargs) -> dict[str, Any]:
    """How many values each mean averages over: none (a selection that picked nothing) is 0/0."""
    if not isinstance(dim, (int, list, tuple)) or not dim:  # mean.default(self, dtype), or every dim
        dim = None
    return {"reduced_count": _count_over(x, dim)}


# Losses that reduce by a mean unless told otherwise (torch's reduction enum: 0 none,
# 1 mean, 2 sum), by where their `reduction` argument sits. A mean over an empty selection
# (`F.mse_loss(pred[keep], y[keep])` with nothing kept) is 0/0, as `mean` is.
_REDUCTION_AT = {"mse_loss": 2, "smooth_l1_loss": 2, "huber_loss": 2, "soft_margin_loss": 2, "l1_loss": 2,
                 "binary_cross_entropy": 3, "binary_cross_entropy_with_logits": 4}


def _mean_loss_facts(reduction_at: int):
    def facts(x, *args, **kwargs) -> dict[str, Any]:
        """How many values the loss averages over (under `reduction='mean'`)."""
        reduction = kwargs.get("reduction", args[reduction_at - 1] if len(args) >= reduction_at else 1)
        return {"reduced_count": x.numel()} if reduction == 1 else {}

    return facts


for _loss, _at in _REDUCTION_AT.items():
    collects(_loss)(_mean_loss_facts(_at))


def _count_over(x, dim) -> int:
    """How many values a reduction of `x` over `dim` (None: all of them) takes for each output."""
    if dim is None:
        return x.numel()
    count = 1
    for d in [dim] if isinstance(dim, int) else dim:
        count *= x.shape[d] if x.dim() else 1
    return int(count)


@collects("std", "var", "std_mean", "var_mean")
def spread_facts(x, dim=None, *rest, correction=None, unbiased=None, **kwargs) -> dict[str, Any]:
    """How many values each std/var reduces over, and the correction taken from that count:
    N - correction <= 0 (one value with Bessel's correction) divides by zero."""
    if isinstance(dim, bool):  # `var.default(self, unbiased)`: no dim, the flag in its place
        dim, unbiased = None, dim
    elif rest and isinstance(rest[0], bool):  # `var.dim(self, dim, unbiased, keepdim)`
        unbiased = rest[0]
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    return {"reduced_count": _count_over(x, dim), "correction": float(correction)}


@collects(*SOFTMAX_OPS)
def softmax_facts(x, dim, *rest, **kwargs) -> dict[str, Any]:
    """Over square scores (T queries x T keys, softmax over the keys), which query rows have
    every key at -inf, and whether the same rows do in every matrix: then the mask's own
    shape leaves them nothing (a causal mask that also hides the diagonal), not the data's
    padding, which differs from sequence to sequence."""
    if not isinstance(x, torch.Tensor) or x.dim() < 2 or dim % x.dim() != x.dim() - 1 or x.shape[-1] != x.shape[-2]:
        return {}
    keyless = torch.isneginf(x).all(-1).reshape(-1, x.shape[-2])
    rows = keyless.any(0).nonzero().flatten().tolist()
    if not rows:
        return {}
    same_everywhere = len(keyless) > 1 and bool((keyless == keyless[0]).all())
    return {"keyless_queries": tuple(rows), "keyless_in_every_matrix": same_everywhere}
