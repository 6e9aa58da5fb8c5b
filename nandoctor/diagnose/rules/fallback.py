"""Rules tried when no op rule applies: the run's history, the dtype, Inf arithmetic."""
from __future__ import annotations

import math
import statistics

from nandoctor.diagnose import words
from nandoctor.diagnose.evidence import FLOAT_MAX, OVERWRITTEN_SUFFIX, Evidence, count_of, fmt
from nandoctor.diagnose.registry import fallback_rule
from nandoctor.report.model import Cause


@fallback_rule
def fp16_overflow(ev: Evidence) -> Cause | None:
    if ev.dtype != "float16" or not ev.made_inf() or not ev.inputs_finite():
        return None
    biggest = max((max(abs(s.min or 0), abs(s.max or 0)) for s in ev.root.inputs), default=None)
    dtypes = sorted({s.dtype for s in ev.root.inputs}) or ["float16"]
    if ev.op in _CASTS:
        return Cause(
            "fp16_overflow",
            "a cast to float16 of values past 65504",
            f"At {ev.where} ({ev.code}) `{ev.op}` casts {'/'.join(dtypes)} values as large as {fmt(biggest)} to "
            "float16, whose largest value is 65504: they become Inf (a checkpoint's running statistics or a "
            "constant that float32 holds fine).",
            "Keep those tensors in float32 (cast the model with `.half()` only where the values fit, e.g. leave "
            "normalisation layers and their buffers in float32), or use bfloat16, which has float32's range.",
        )
    return Cause(
        "fp16_overflow",
        "float16 overflow (past 65504)",
        f"At {ev.where} ({ev.code}) `{ev.op}` has finite {'/'.join(dtypes)} inputs (largest magnitude "
        f"{fmt(biggest)}) but its float16 result exceeds float16's largest value, 65504, and becomes Inf."
        + (" The input at that magnitude is a mask written finite on purpose (`torch.finfo(torch.float16).min`, "
           "-1e4): the op took it past the range (a log_softmax subtracts the row's max and its log-sum-exp), and "
           "the -inf went on to make NaN (0 * -inf in an entropy's p * log p)." if ev.facts.mask_overflowed else ""),
        ("Compute this op in float32 (`F.log_softmax(logits.float(), -1)`), where the mask stays finite, or "
         "drop the masked terms before multiplying (`torch.special.entr(p)`, `torch.xlogy(p, p)`, `torch.where(p > "
         "0, p * logp, 0)`)." if ev.facts.mask_overflowed else _fp16_fix(ev)),
    )


_PRODUCTS = ("mm", "bmm", "matmul", "addmm", "baddbmm", "einsum")


def _fp16_fix(ev: Evidence) -> str:
    """Out of float16's range in backward, a GradScaler's dynamic scale is the remedy; in
    forward it is not (it scales gradients, not activations): the values must shrink or
    the op must run in a wider type."""
    wider = ("Use bfloat16 autocast (`torch.autocast(device_type, dtype=torch.bfloat16)`), which has float32's "
             "range, or keep this op in float32")
    if ev.root.phase == "backward":
        return wider + "; with float16 use `torch.amp.GradScaler`, whose scale backs off when gradients overflow."
    scaled = (" (`torch.autocast(device_type, enabled=False)` around it, inputs `.float()`). A product of large "
              "activations such as attention scores: scale an operand before it (`q * head_dim ** -0.5`) or use "
              "`F.scaled_dot_product_attention`" if ev.op in _PRODUCTS else
              " (`torch.autocast(device_type, enabled=False)` around it, inputs `.float()`), or scale its inputs "
              "down (normalise them)")
    return wider + scaled + ". A GradScaler does not help here: it scales gradients, not forward values."


# Ops that only convert a tensor's dtype: an Inf they make is the cast's, not arithmetic's.
_CASTS = {"_to_copy", "copy_", "copy"}


# One step that multiplies the loss by a million is no noise: a learning rate so large the
# run overflows at its third step leaves only two finite values (3e8 -> 4e19 -> Inf).
SINGLE_STEP_EXPLOSION = 1e6


def growth(values: list) -> tuple[float, list[float]] | None:
    """(growth factor over the window, the window) when the series grew geometrically."""
    finite = [abs(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    window = finite[-8:]
    if len(window) == 2 and window[0] > 0 and window[1] / window[0] >= SINGLE_STEP_EXPLOSION:
        return window[1] / window[0], window
    if len(window) < 3 or window[0] <= 0:
        return None
    ratios = [b / a for a, b in zip(window, window[1:]) if a > 0]
    rising = sum(r > 1.5 for r in ratios)
    factor = window[-1] / window[0]
    if factor >= 100 and rising >= max(2, math.ceil(len(ratios) * 2 / 3)):
        return factor, window
    # A noisy divergence (a large learning rate bounces before it runs away: 146 -> 498 ->
    # 52 -> 825 -> 354 -> 2.5e4 -> 6.6e10) ends in a runaway: a millionfold over the window,
    # rising over its last two steps.
    if factor >= SINGLE_STEP_EXPLOSION and len(ratios) >= 2 and all(r > 1.5 for r in ratios[-2:]):
        return factor, window
    return _sustained_rise(finite)


def _sustained_rise(finite: list[float]) -> tuple[float, list[float]] | None:
    """A divergence slower than the window sees, over the whole history kept: a learning
    rate just past stable multiplies the loss by 1.8 a step (1.8^7 is 61x in eight values,
    1e15x in sixty), and one that blows up and then hovers near the overflow (SWA's high
    constant rate) rose a millionfold before it levelled off. The peak a millionfold above
    where the history started (the median of its first quarter), the last value still
    within a thousandfold of it, and the climb from the last value at the start's level to
    the peak at least three steps long and up on two steps in three. A level run with one
    bad batch's jump at its end climbed in one step."""
    if len(finite) < 4:
        return None
    start = statistics.median(finite[:max(1, len(finite) // 4)])
    peak_at = max(range(len(finite)), key=finite.__getitem__)
    peak = finite[peak_at]
    if start <= 0 or peak / start < SINGLE_STEP_EXPLOSION or finite[-1] * 1e3 < peak:
        return None
    climb_from = max((i for i in range(peak_at) if finite[i] <= start), default=0)
    climb = finite[climb_from:peak_at + 1]
    if len(climb) < 4:
        return None
    ratios = [b / a for a, b in zip(climb, climb[1:]) if a > 0]
    if sum(r > 1 for r in ratios) * 3 < len(ratios) * 2:
        return None
    return finite[-1] / start, finite


def _shown(values: list[float], most: int = 8) -> str:
    """A series as `a → b → c`, at most `most` values of it, evenly spaced, the last one last."""
    if len(values) > most:
        values = [values[round(i * (len(values) - 1) / (most - 1))] for i in range(most)]
    return " → ".join(fmt(v) for v in values)


@fallback_rule
def exploding_gradient(ev: Evidence) -> Cause | None:
    loss = growth(ev.history.loss)
    grad = growth(ev.history.grad_norm)
    if not (loss or grad):
        return _blown_up_by_an_update(ev)
    series = []
    if loss:
        series.append(f"the loss grew {fmt(loss[0])}x over the last {len(loss[1])} steps ({_shown(loss[1])})")
    if grad:
        series.append(f"the gradient norm grew {fmt(grad[0])}x ({_shown(grad[1])})")
    return Cause(
        "exploding_gradient",
        "exploding gradients: the values grew geometrically until they overflowed",
        f"{'; '.join(series).capitalize()}. {_when(ev)} `{ev.op}` at {ev.where} overflowed "
        f"{ev.dtype} ({fmt(FLOAT_MAX.get(ev.dtype))}). Each update overshoots the minimum by more than it corrects: "
        "the learning rate is too large for the scale of the inputs.",
        "Lower the learning rate (try 10-100x smaller), normalise the inputs/targets (zero mean, unit variance), "
        "and clip gradients before the step: `torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)`.",
    )


# Values no data or activation of a working model reaches: weights an update threw out.
_ASTRONOMICAL = 1e15
_FIRST_UPDATES = 3  # a rate that is orders of magnitude off blows the weights up at once


def _blown_up_by_an_update(ev: Evidence) -> Cause | None:
    """Too few steps for a series to grow (a learning rate typed 3e2 for 3e-2): the last
    loss was moderate and finite, and one or two updates later a forward op overflows on
    values no data reaches. Only the update can have put them there."""
    losses = [v for v in ev.history.loss if v is not None]
    largest = _largest_input(ev)
    if ev.root.phase != "forward" or not ev.step or not losses or not all(math.isfinite(v) for v in losses) \
            or not ev.made_inf() or not ev.inputs_finite() or largest is None or largest < _ASTRONOMICAL:
        return None
    if ev.step > _FIRST_UPDATES or abs(losses[-1]) > 1e6:
        return _blown_up_after_a_spike(ev, losses, largest)
    norms = [v for v in ev.history.grad_norm if v is not None and math.isfinite(v)]
    return Cause(
        "exploding_gradient",
        "the weights blew up in the first updates: the learning rate is far too large",
        f"The loss was {fmt(losses[-1])}" + (f" with a gradient norm of {fmt(norms[-1])}" if norms else "")
        + f"; {_when(ev).lower()} `{ev.op}` at {ev.where} ({ev.code}) takes values as large as {fmt(largest)} and "
        f"overflows {ev.dtype}. No data is at that scale: the update moved the weights by far more than their own "
        "size, as a learning rate orders of magnitude too large does (a typo like 3e2 for 3e-2, or a rate meant for "
        "another optimizer: Adam moves each weight by about lr per step).",
        "Check the learning rate (for Adam, 1e-4 to 1e-3 is typical; for SGD it depends on the input scale), warm it "
        "up from a small value, and clip gradients before the step: "
        "`torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)`.",
    )


# A loss this many times its early level, some steps before the overflow: a divergence the
# run seemed to recover from (a learning rate that a schedule multiplies, StepLR's gamma=10
# for 0.1), which left the weights at a scale no data reaches.
_SPIKE = 1e6


def _blown_up_after_a_spike(ev: Evidence, losses: list[float], largest: float) -> Cause | None:
    early = min(abs(v) for v in losses[:3]) or min((abs(v) for v in losses if v), default=0.0)
    peak_at = max(range(len(losses) - 1), key=lambda i: abs(losses[i]), default=None)
    if not early or peak_at is None or abs(losses[peak_at]) < _SPIKE * early:
        return None
    steps = ev.history.steps
    when = f"step {steps[peak_at]}" if peak_at < len(steps) else "an earlier step"
    return Cause(
        "exploding_gradient",
        "the weights blew up in an earlier divergence: the learning rate is too large",
        f"The loss spiked to {fmt(losses[peak_at])} at {when}, {fmt(abs(losses[peak_at]) / early)}x the "
        f"{fmt(early)} it was before, then came back down to {fmt(losses[-1])}; {_when(ev).lower()} `{ev.op}` at {ev.where} "
        f"({ev.code}) takes values as large as {fmt(largest)} and overflows {ev.dtype}. No data is at that scale: "
        "the divergence threw the weights out of range and they stayed there. Typical of a learning rate a "
        "schedule keeps raising (StepLR's `gamma` typed 10 for 0.1) or one far too large for the inputs.",
        "Check the learning rate and its schedule (print `optimizer.param_groups[0]['lr']` per epoch; a decay's "
        "gamma is below 1), and clip gradients before the step: "
        "`torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)`.",
    )


def _when(ev: Evidence) -> str:
    """`At step 12`, or, in an update loop written by hand (no optimizer to count steps),
    `After 12 backward passes`."""
    if ev.step is not None:
        return f"At step {ev.step}"
    passes = ev.history.steps[-1] if ev.history.steps else 0  # (the history keeps only the last ones)
    return f"After {passes} backward pass{'es' if passes != 1 else ''}"


@fallback_rule
def placeholder_used(ev: Evidence) -> Cause | None:
    """The op received NaN the script wrote on purpose (`torch.full(..., nan)` marking empty
    slots or missing values) and computed with it: nothing made a NaN here, a placeholder
    was used as a number (the slot was never filled, or never masked out)."""
    born = words.inf_source(ev.facts)
    bad = [s for s in ev.root.inputs if s.nonfinite and not s.name.endswith(OVERWRITTEN_SUFFIX)]
    if not born or not bad or any(s.posinf or s.neginf for s in bad):
        return None
    return Cause(
        "mask_value_used",
        "a NaN written on purpose (a placeholder) was used as a number",
        f"At {ev.where} ({ev.code}) `{ev.op}` computed with NaN written on purpose at {born}: "
        + "; ".join(f"`{s.name}` held {s.nan} NaN" for s in bad) + ". A NaN that marks an empty slot or a missing "
        "value is meant to be selected out (`x[~torch.isnan(x)]`, a count of the filled slots) or replaced before any "
        "arithmetic; here it reached the model or the loss: entries that were never filled were used.",
        "Use only the filled entries (index with the filled count or a validity mask: `buf[:n_filled]`, "
        "`x[valid]`), or replace the placeholder before use (`torch.nan_to_num(x, nan=0.0)`, "
        "`torch.where(torch.isnan(x), fill, x)`) and mask those positions out of the loss.",
    )


@fallback_rule
def inf_arithmetic(ev: Evidence) -> Cause | None:
    born = words.inf_source(ev.facts)
    if ev.inputs_finite() and not born:
        return None
    masked = _mask_times_inf(ev) or _minus_inf_minus_itself(ev, born) or _masked_entries_reduced(ev, born)
    if masked is not None:
        return masked
    return Cause(
        "inf_arithmetic",
        "arithmetic on values that were already infinite",
        f"At {ev.where} ({ev.code}) `{ev.op}` received Inf inputs and "
        + ("made NaN (inf - inf, 0 * inf, inf / inf)." if ev.made_nan() else "passed the Inf on.")
        + (f" The Inf was written at {born}." if born else
           " The Inf came from outside the ops nandoctor saw." if ev.facts.untracked_input else ""),
        "Do not let the Inf exist: use a large finite sentinel (`torch.finfo(dtype).min`) instead of ±inf, "
        "or replace it before arithmetic (`torch.nan_to_num(x, posinf=..., neginf=...)`).",
    )


# Ops whose formula is infinite at finite points (poles, edges of their domain): an Inf
# they make from finite inputs is not an overflow, and float64 gives the same Inf.
_POLES = {"atanh", "arctanh", "erfinv", "logit", "digamma", "polygamma", "lgamma", "mvlgamma", "special_ndtri",
          "xlog1py", "special_xlog1py"}


@fallback_rule
def singularity(ev: Evidence) -> Cause | None:
    """atanh(±1), erfinv(±1), logit(0), digamma(0): the op at a point where it is infinite."""
    largest = _largest_input(ev)
    if ev.op not in _POLES or not ev.made_inf() or not ev.inputs_finite() or largest is None:
        return None
    return Cause(
        "singularity",
        f"`{ev.op}` at a point where it is infinite",
        f"At {ev.where} ({ev.code}) `{ev.op}` made Inf from finite inputs no larger than {fmt(largest)}: not an "
        "overflow, but a point where the function itself is infinite (a pole or the edge of its domain: atanh and "
        "erfinv at ±1, logit at 0 and 1, digamma and lgamma at 0). A wider dtype gives the same Inf.",
        "Keep the inputs inside the op's domain: clamp them away from the edge (`x.clamp(-1 + 1e-6, 1 - 1e-6)` for "
        "atanh of actions a tanh squashed, `torch.logit(p, eps=1e-6)`), or compute the value in a form that "
        "avoids the edge (a TanhTransform's `cache_size=1` keeps the pre-tanh value).",
    )


def _largest_input(ev: Evidence) -> float | None:
    return max((max(abs(s.min or 0), abs(s.max or 0)) for s in ev.root.inputs if s.min is not None), default=None)


@fallback_rule
def float_overflow(ev: Evidence) -> Cause | None:
    if not ev.made_inf() or not ev.inputs_finite():
        return None
    return Cause(
        "float_overflow",
        f"{ev.dtype} overflow",
        f"At {ev.where} ({ev.code}) `{ev.op}` has finite inputs but its result is beyond {ev.dtype}'s range "
        f"({fmt(FLOAT_MAX.get(ev.dtype))}). The inputs' largest magnitude is "
        f"{fmt(_largest_input(ev))}.",
        "Scale the values down (normalise inputs, smaller initialisation, lower learning rate) or compute in a "
        "wider dtype (float64 for this op).",
    )


def _minus_inf_minus_itself(ev: Evidence, born: str | None) -> Cause | None:
    """`x - x.logsumexp(-1, keepdim=True)` (`Categorical(logits=x)`, a log-softmax by hand)
    or `x - running_max` where everything reduced over is -inf: -inf - (-inf) = NaN."""
    x, reduced = ev.input("self"), ev.input("other")
    if not ev.op.startswith("sub") or not ev.made_nan() or x is None or reduced is None \
            or not x.neginf or not reduced.neginf:
        return None
    return Cause(
        "inf_arithmetic",
        "values normalised by a max or logsumexp that is -inf itself",
        f"At {ev.where} ({ev.code}) `sub` takes -inf values ({count_of(x.neginf, x)}) minus a reduction of them "
        f"that is -inf too ({count_of(reduced.neginf, reduced)}): -inf - (-inf) = NaN ({ev.output.nan} NaN). "
        "That is `x - x.logsumexp(-1, keepdim=True)`, what `Categorical(logits=x)` and a log-softmax by hand compute, "
        "or `x - running_max`, over entries that are all masked: a row with nothing left to choose (a decoding "
        "loop that runs one step too many, a sample with no valid class), or a chunk with nothing unmasked yet."
        + (f" The -inf was written at {born}." if born else ""),
        "Make sure every row keeps an entry it may choose (stop the loop when all are taken, give an empty row a "
        "dummy valid entry, or drop it), or start a running max at a finite value. A finite fill "
        "(`torch.finfo(x.dtype).min`) only hides the NaN: such a row then chooses uniformly among masked entries.",
    )


def _masked_entries_reduced(ev: Evidence, born: str | None) -> Cause | None:
    """`-log_softmax(masked).sum(-1)` (cross_entropy's label smoothing over a vocabulary
    with -inf masked classes), `masked.mean()`, `masked @ v`: a mask's -inf written on
    purpose, then combined with the other entries instead of vanishing in a softmax, a max
    or a `where`."""
    masked = next((s for s in ev.root.inputs if s.neginf or s.posinf), None)
    if not born or masked is None or ev.made_nan() or not ev.facts.combined_written_inf:
        return None
    return Cause(
        "inf_arithmetic",
        "masked entries summed with the others",
        f"At {ev.where} ({ev.code}) `{ev.op}` combines entries of which {_infinities(masked)} were written at {born} "
        f"(a mask, or a sentinel), so its result is infinite. A mask's -inf is meant to vanish "
        "where it is consumed (softmax, max, logsumexp, `where`); a sum, mean or product over the masked positions "
        "keeps it. If the line calls a library function, that function sums over every position (cross_entropy's "
        "`label_smoothing` spreads mass over all classes, masked ones too).",
        "Combine only the unmasked entries (`x.masked_fill(mask, 0).sum()`, `x[~mask].mean()`; smooth labels over "
        "the allowed classes only), or write a large finite negative value instead of -inf: "
        "`x.masked_fill(mask, torch.finfo(x.dtype).min)`.",
    )


def _zero_weights_times_infinite_values(ev: Evidence, zeros, infinite) -> Cause:
    """`pi * log_softmax(masked_logits)`, `plan * cost` with forbidden cells at +inf: weights
    that are 0 where the values are infinite. The term is meant to vanish there; 0 * inf is
    NaN instead."""
    return Cause(
        "inf_arithmetic",
        "zero weights multiplied by infinite values",
        f"At {ev.where} ({ev.code}) `{infinite.name}` holds {_infinities(infinite)} (a log-probability of a masked "
        f"class, an infinite cost) and `{zeros.name}` weighs them by 0 ({count_of(zeros.zeros, zeros)} zeros): "
        f"0 * inf = NaN ({ev.output.nan if ev.output else 'some'} NaN), where the term was meant to vanish.",
        "Drop the zero-weight terms instead of multiplying them: `torch.xlogy(p, q)` for p * log q, "
        "`torch.special.entr(p)` for -p * log p (0 where p is 0, with a finite gradient); for other weights `w` "
        "and values `v`, `torch.where(w > 0, w * v, 0.0)` when `w` takes no gradient (if it does, backward "
        "multiplies by the Inf again: make `v` finite there first); or keep the values finite where they are "
        "masked (a `torch.finfo(dtype).min` mask for the logits, a large finite cost).",
    )


def _infinities(s) -> str:
    return " and ".join(f"{count_of(n, s)} {sign}" for n, sign in ((s.posinf, "+inf"), (s.neginf, "-inf")) if n)


def _mask_times_inf(ev: Evidence) -> Cause | None:
    """`(1 - allowed) * float("-inf")`: a 0/1 mask multiplied by an infinity, as older code
    builds an additive attention mask with a large negative number; with -inf itself the
    allowed positions are 0 * -inf = NaN."""
    if not ev.op.startswith("mul") or not ev.made_nan():
        return None
    inputs = ev.root.inputs
    zeros = next((s for s in inputs if s.zeros and not s.nonfinite), None)
    infinite = next((s for s in inputs if s.posinf or s.neginf), None)
    if zeros is None or infinite is None:
        return None
    if infinite.posinf + infinite.neginf < infinite.numel:
        return _zero_weights_times_infinite_values(ev, zeros, infinite)
    return Cause(
        "inf_arithmetic",
        "a mask multiplied by an infinity",
        f"At {ev.where} ({ev.code}) {count_of(zeros.zeros, zeros)} values of `{zeros.name}` are 0 and are multiplied "
        f"by an infinity: 0 * inf = NaN ({ev.output.nan if ev.output else 'some'} NaN). Multiplying a 0/1 mask by a "
        "large negative number builds an additive mask; with -inf the positions meant to stay 0 become NaN.",
        "Select instead of multiplying: `torch.where(allowed, 0.0, float('-inf'))` or "
        "`torch.zeros_like(scores).masked_fill(~allowed, float('-inf'))`.",
    )
