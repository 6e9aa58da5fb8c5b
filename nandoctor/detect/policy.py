"""When a non-finite value made by an op is a verdict (stop the run) or a suspect.

1. A NaN made in forward, optimizer or data loading stops the run at once.
2. An Inf is a suspect: it stops the run when it reaches the loss (`backward()`), a
   gradient, a parameter or optimizer state (the boundaries check those), when it is made
   inside the optimizer, or when its dtype is listed in `stop_on_inf_dtypes`.
3. Inside backward, NaN and Inf are suspects too: autograd formulas make Inf and mask it
   (atan2 at the origin, norm at zero). What counts is a gradient still non-finite when
   `backward()` returns.
4. Values written on purpose (`masked_fill(mask, -inf)`) never stop it.
"""
from __future__ import annotations

from nandoctor.detect.result import StopReason


def op_verdict(phase: str, has_nan: bool, dtype, intended: bool, stop_inf_dtypes) -> StopReason | None:
    """The reason to stop at an op that made a non-finite value, or None (a suspect)."""
    if phase == "backward" or intended:
        return None
    if has_nan:
        return StopReason.OP_MADE_NAN
    if phase == "optimizer" or dtype in stop_inf_dtypes:
        return StopReason.OP_MADE_INF
    return None
