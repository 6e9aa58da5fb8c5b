"""When a non-finite value made by an op is a verdict (stop the run) or a suspect.

1. A NaN or an Inf made in forward, data loading or setup is a suspect: it is remembered
   (its record, for the lineage) and stops the run only when it reaches something that
   matters — the loss given to `backward()`, a gradient, a parameter or buffer, optimizer
   state, or a value the script reads back (`.item()`, `.tolist()`, `.numpy()`, printing).
   A value the script discards (`torch.where`, `nan_to_num`, `nanmean`) never stops it.
2. An op inside the optimizer step, or one that writes into a parameter or buffer, stops
   the run at once; so does an Inf in a dtype listed in `stop_on_inf_dtypes`.
3. Inside backward, NaN and Inf are suspects too: autograd formulas make Inf and mask it
   (atan2 at the origin, norm at zero). What counts is a gradient still non-finite when
   `backward()` returns.
4. Values written on purpose (`masked_fill(mask, -inf)`), and lines the user allowed
   (`# nandoctor: allow`, `run.allow`), are never roots and never stop it by themselves.
"""
from __future__ import annotations

from nandoctor.detect.result import StopReason


def op_verdict(phase: str, has_nan: bool, has_inf: bool, dtype, *, accepted: bool = False,
               writes_parameter: bool = False, stop_inf_dtypes=()) -> StopReason | None:
    """The reason to stop at an op that made a non-finite value, or None (a suspect)."""
    if phase == "backward" or accepted:
        return None
    if writes_parameter:
        return StopReason.PARAMETER_WRITTEN
    if phase == "optimizer" or (has_inf and dtype in stop_inf_dtypes):
        return StopReason.OP_MADE_NAN if has_nan else StopReason.OP_MADE_INF
    return None
