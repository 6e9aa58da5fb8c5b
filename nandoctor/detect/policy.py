"""When a non-finite value made by an op is a verdict (stop the run) or a suspect.

1. A NaN or an Inf made in forward, data loading or setup is a suspect: it is remembered
   (its record, for the lineage) and stops the run only when it reaches something that
   matters — the loss given to `backward()`, a gradient, a parameter or buffer, optimizer
   state, or a value the script reads back (`.item()`, `.tolist()`, `.numpy()`, printing).
   A value the script discards (`torch.where`, `nan_to_num`, `nanmean`) never stops it.
2. An op inside the optimizer step, or one that writes into a parameter or buffer, stops
   the run at once. An Inf in a dtype listed in `stop_on_inf_dtypes` is an overflow: it
   stops the run where an op absorbs it unhandled (`an_overflow`), or at once with
   `strict_overflow`.
3. Inside backward, NaN and Inf are suspects too: autograd formulas make Inf and mask it
   (atan2 at the origin, norm at zero). What counts is a gradient still non-finite when
   `backward()` returns.
4. Values written on purpose (`masked_fill(mask, -inf)`), and lines the user allowed
   (`# nandoctor: allow`, `run.allow`), are never roots and never stop it by themselves.
"""
from __future__ import annotations

import math

from nandoctor.detect.result import StopReason


def op_verdict(phase: str, has_nan: bool, has_inf: bool, dtype, *, accepted: bool = False,
               writes_parameter: bool = False) -> StopReason | None:
    """The reason to stop at an op that made a non-finite value, or None (a suspect)."""
    if phase == "backward" or accepted:
        return None
    if writes_parameter:
        return StopReason.PARAMETER_WRITTEN
    if phase == "optimizer":
        return StopReason.OP_MADE_NAN if has_nan else StopReason.OP_MADE_INF
    return None


def an_overflow(phase: str, has_inf: bool, dtype, stop_inf_dtypes) -> bool:
    """Is an Inf an op made an overflow of a narrow dtype (`run.stop_on_inf_dtypes`, float16
    by default)? Not a stop where it is made: a script may clamp it (Hugging Face's T5 and
    BART clamp float16 hidden states to finfo.max - 1000), test for it, or let it reach the
    loss (a stop there). Where an op absorbs it into finite values unhandled (a sigmoid
    saturating at 1, relu of -inf, exp of -inf) the run stops at the op that overflowed:
    the model trains on garbage from there, with no NaN to show for it."""
    return has_inf and phase != "backward" and dtype in stop_inf_dtypes


# Ops that test a value for finiteness.
TESTS_FINITENESS = frozenset({"isinf", "isnan", "isfinite", "isposinf", "isneginf"})


def tests_finiteness(name: str, args) -> bool:
    """Does the op test its input for NaN/Inf: `isnan`, `isinf`, or how `torch.isfinite`
    is built, `x == x` and `x.abs() != inf`?"""
    if name in TESTS_FINITENESS:
        return True
    if name not in ("eq", "ne") or len(args) < 2:
        return False
    other = args[1]
    return other is args[0] or isinstance(other, float) and not math.isfinite(other)


# Ops that handle a non-finite value they are handed: test for it, compare it, replace it
# or skip it (the NaN-aware reductions).
HANDLES_NONFINITE = TESTS_FINITENESS | {"eq", "ne", "lt", "le", "gt", "ge", "signbit", "nan_to_num", "nan_to_num_",
                                        "nansum", "nanmean", "nanmedian", "nanquantile", "fmax", "fmin"}
