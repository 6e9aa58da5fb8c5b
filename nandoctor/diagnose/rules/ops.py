"""Rules by op family: the root op and the statistics of what went into it.

Each rule serves the forward op and, where the op's derivative is the problem, the backward
node that differentiates it (`ev.node` is set then, and `ev.root.location` is the forward
line whose backward failed).
"""
from __future__ import annotations

import linecache
import math
import re

from nandoctor.detect.ops import ATTENTION_OPS, SOFTMAX_OPS
from nandoctor.diagnose import words
from nandoctor.diagnose.evidence import EXP_LIMIT, FLOAT_MAX, Evidence, count_of, fmt
from nandoctor.diagnose.registry import op_rule
from nandoctor.report.model import Cause


def _producer(ev: Evidence, name: str) -> str | None:
    return ev.facts.input_producers.get(name)


_LOGS = ("log", "log2", "log10", "log1p", "xlogy")


@op_rule(*_LOGS, nodes=("LogBackward", "Log2Backward", "Log10Backward", "Log1PBackward", "XlogyBackward"),
         in_formulas=True)
def log_nonpositive(ev: Evidence) -> Cause | None:
    # xlogy(x, y) = x * log(y): the log's argument is `other`, `self` only multiplies it.
    x = (ev.input("other") if ev.op == "xlogy" else None) or ev.input("self", "x", "input") or ev.first_input()
    lower = -1.0 if ev.op == "log1p" else 0.0
    # A log node's root is the division of its derivative 1/x; a node whose formula takes
    # a log itself (entr's -(log(p) + 1)) has the log as its root, judged like a forward log.
    if ev.node and ev.op not in _LOGS:  # the derivative 1/x blew up: x was 0 or so tiny that 1/x overflows
        # The backward op is grad / x: its `other` is log's own input.
        x = ev.input("other") or ev.first_input()
        small = (f"the smallest input to log was {fmt(x.min)}" if x is not None and x.min is not None
                 else "its inputs were at or near 0")
        return Cause(
            "log_nonpositive",
            "log of a value at or near zero: its gradient 1/x overflowed",
            f"The backward of `{ev.forward_op}` at {ev.where} ({ev.code}) divides the incoming gradient by x; "
            f"{small}, so 1/x is Inf and the gradient turns Inf/NaN ({_out(ev)}). "
            "Inputs this small usually come from a softmax/sigmoid that underflowed.",
            "Work in log space: use `F.log_softmax(logits, dim=-1)` / `F.cross_entropy(logits, target)` "
            "instead of `torch.log(torch.softmax(...))`, or clamp first: `torch.log(x.clamp_min(1e-7))`.",
        )
    if x is None:
        return None
    zeros = x.zeros
    bad = x.negatives if lower == 0.0 else None
    parts = []
    if zeros and lower == 0.0:
        parts.append(f"{count_of(zeros, x)} inputs are 0 (log(0) = -inf)")
    if bad:
        parts.append(f"{count_of(bad, x)} are negative (log(<0) = NaN; the smallest is {fmt(x.min)})")
    if lower == -1.0 and x.min is not None and x.min <= -1:
        parts.append(f"some inputs are <= -1 (the smallest is {fmt(x.min)}): log1p needs x > -1")
    if not parts and x.nonfinite:
        return None  # the inputs were already non-finite: not log's fault
    if not parts:
        return None
    source = _producer(ev, x.name)
    underflow = (f" The input comes from `{source}`: its exact zeros are where a logit was -inf (a mask) or where "
                 "it underflowed." if source and "softmax" in source.lower() else "")
    rounded = _rounded_to_zero(x.dtype) if zeros and lower == 0.0 else ""
    saturated, in_log_space = _saturated(source, ev.code, ev.dtype) if zeros and lower == 0.0 else ("", None)
    inside = (f" the gradient of `{ev.forward_op}` takes {ev.op} of its input, infinite at 0 where "
              f"`{ev.forward_op}` itself is finite" if ev.node else "")
    return Cause(
        "log_nonpositive",
        f"{ev.op} of a non-positive value" + (f" in the gradient of `{ev.forward_op}`" if ev.node else ""),
        f"At {ev.where} ({ev.code}){inside}: {'; '.join(parts)}.{underflow}{saturated}{rounded}",
        _first((in_log_space or "Compute it in log space (`F.logsigmoid(x)` / `F.logsigmoid(-x)` for log(p) / "
                "log(1 - p), `F.binary_cross_entropy_with_logits`)") + (", or in float32 outside autocast; or" if rounded else "; or")
               if rounded or saturated else None,
               _LOG_OF_SOFTMAX_FIX if underflow else
               "Keep the argument positive: `torch.log(x.clamp_min(eps))` (eps=1e-7 for float32), or parametrise a "
               "positive quantity as `softplus(raw)` or `exp(log_param)`."),
    )


_LOG_OF_SOFTMAX_FIX = (
    "Take the log of a softmax in one op: `F.log_softmax(logits, dim=-1)` (with `F.nll_loss`), or "
    "`F.cross_entropy(logits, target)` on the logits (a model that ends in `nn.Softmax`: leave it out of the loss); "
    "log(softmax) is -inf where the softmax underflowed to 0, and its gradient NaN there even where the loss never "
    "looks. Clamping (`torch.log(p.clamp_min(1e-7))`) only hides the underflow.")


# The logit above which a sigmoid rounds to exactly 1.0: 1 - 2**-mantissa bits, logit =
# mantissa * ln 2 (bfloat16 keeps 8 bits, float16 11, float32 24, float64 53).
_SIGMOID_ONE_ABOVE = {"bfloat16": 6, "float16": 8, "float32": 17, "float64": 37}


def _saturated(source: str | None, code: str | None, dtype: str = "float32") -> tuple[str, str | None]:
    """A log of `1 - p`, of a sigmoid or of a sum of exps: a value that saturated or
    underflowed, not a bad one. (What to say of it, and the log-space form to use when it
    is not log-sigmoid's.)"""
    if source is None:
        return "", None
    if source.startswith(("Cumsum", "Sum", "Exp")) and "exp" in (code or ""):
        return (" The input is `exp(...)` (or a sum of them) that underflowed to exactly 0: exp of anything below "
                "about -103 is 0 in float32.",
                "Compute it in log space: a log of a sum of exps is `torch.logsumexp(x, dim)` "
                "(`torch.logcumsumexp(x, dim)` for a running sum, as a Cox risk set), which never forms the exps")
    if source.startswith("Rsub"):
        return (" The input is `1 - p`: it is exactly 0 where p is 1, as a probability that saturated is (a sigmoid "
                f"of a logit above about {_SIGMOID_ONE_ABOVE.get(dtype, 17)} is 1.0 in "
                f"{dtype if dtype in _SIGMOID_ONE_ABOVE else 'float32'}).", None)
    if source.startswith("Sigmoid"):
        return (" The input comes from a sigmoid: it is exactly 0 where the logit was below about -88 (float32 "
                "underflows).", None)
    return "", None


def _rounded_to_zero(dtype: str, near_one: str = "a probability near 1", difference: str = "`1 - p` or `p`") -> str:
    """In a 16-bit float a probability near 1 rounds to exactly 1 (bfloat16 keeps 8 bits:
    anything above 1 - 2**-9), so `1 - p` is 0 where float32 would give a small number."""
    if dtype not in ("bfloat16", "float16"):
        return ""
    return (f" The values are {dtype}: {near_one} rounds to exactly 1 (and a tiny one to 0), "
            f"so {difference} is 0 where float32 would have kept a small positive number.")


def _first(before: str | None, fix: str) -> str:
    """`fix`, with a more pressing advice put before it (the fix then goes on in lower case)."""
    return f"{before} {fix[0].lower()}{fix[1:]}" if before else fix


def _out(ev: Evidence) -> str:
    o = ev.output
    if not o:
        return "non-finite output"
    bits = [f"{n}×{label}" for label, n in (("NaN", o.nan), ("+Inf", o.posinf), ("-Inf", o.neginf)) if n]
    return ", ".join(bits) + f" in the output of {o.numel}"


@op_rule("div", "divide", "true_divide", "reciprocal", "floor_divide", "remainder", "fmod", nodes=("DivBackward",))
def div_by_zero(ev: Evidence) -> Cause | None:
    den = ev.input("other", "divisor") or (ev.input("self") if ev.op == "reciprocal" else None)
    num = ev.input("self") if ev.op != "reciprocal" else None
    if den is not None and not den.zeros:
        return _near_zero_divisor(ev, num, den)
    if den is None:
        return None
    producer = _producer(ev, den.name) or ""
    if producer.startswith(("Std", "Var")) or _divides_by_a_spread(ev):
        return zero_variance(ev)
    both = num is not None and num.zeros
    kind = "0/0 = NaN where the numerator is 0 too, x/0 = ±Inf elsewhere" if both else "x/0 = ±Inf (0/0 = NaN)"
    where = "in backward, " if ev.node else ""
    return Cause(
        "div_by_zero",
        "division by zero",
        f"{where.capitalize()}At {ev.where} ({ev.code}) {count_of(den.zeros, den)} denominator values are 0: {kind}. "
        f"Result: {_out(ev)}." + (" The denominator is all zeros (e.g. an empty mask normalised by its max)."
           if den.zeros == den.numel and num is not None and num.zeros == num.numel else "")
        + _rounded_to_zero(den.dtype, "a number near 1 (a `beta` of 0.999, a probability)", "`1 - beta`"),
        _first("Compute the denominator in float32 (a `1 - beta**n` of a bfloat16 beta is 0 in bfloat16), then "
               "cast;" if _rounded_to_zero(den.dtype) else None,
               _angle_fix(ev) or _signed_guard(den) or
               "Guard the denominator: `x / d.clamp_min(eps)` or `x / (d + eps)`; for a max/sum normaliser, "
               "skip or special-case empty inputs (`d = m.max(); m / d if d > 0 else m`)."),
    )


@op_rule("addcdiv")
def addcdiv_by_zero(ev: Evidence) -> Cause | None:
    """`p.addcdiv_(g, h.sqrt(), value=-lr)`: an update divided by a root of accumulated squared
    gradients, which stays 0 where a parameter got no gradient (an Adagrad by hand with no eps).
    (Inside torch's own optimizers, an invalid setting is the cause: see `optimizer_invalid`.)"""
    den = ev.input("tensor2")
    if den is None or not den.zeros:
        return None
    num = ev.input("tensor1")
    both = num is not None and num.zeros
    return Cause(
        "div_by_zero",
        "division by zero in an update",
        f"At {ev.where} ({ev.code}) `addcdiv` divides `tensor1` by `tensor2`, and {count_of(den.zeros, den)} values of "
        f"`tensor2` are 0: {'0/0 = NaN where the gradient is 0 too' if both else 'x/0 = ±Inf'}. Result: {_out(ev)}. "
        "A root of accumulated squared gradients is 0 for every parameter that has had no gradient yet (an "
        "embedding row never looked up, a head whose loss weight is 0).",
        "Add an epsilon to the denominator, as torch's optimizers do: `p.addcdiv_(g, h.sqrt().add_(1e-10), "
        "value=-lr)`.",
    )


def _angle_fix(ev: Evidence) -> str | None:
    """`atan(y / x)`: an angle by hand, which atan2 computes without dividing."""
    if not any(site.op.startswith("aten.atan.") for site in ev.lineage[1:3]):
        return None
    return ("Compute the angle with `torch.atan2(y, x)` instead of `torch.atan(y / x)`: it never divides, is "
            "defined at x = 0 and keeps the quadrant.")


def _signed_guard(den) -> str | None:
    """A denominator with negative values: `clamp_min(eps)` would turn every one into eps."""
    if not den.negatives:
        return None
    return ("Guard the denominator keeping its sign (it has negative values, which `d.clamp_min(eps)` would "
            "turn into eps): `x / torch.where(d.abs() < eps, eps, d)`, or skip the positions where it is 0.")


def _near_zero_divisor(ev: Evidence, num, den) -> Cause | None:
    """A quotient that overflowed because the divisor is tiny, not because the numerator is
    large: `1 / p` of a probability that underflowed to a denormal (3e-41) is x/0 in all but
    name, and its fix is the denominator's guard, not a wider dtype."""
    smallest = _smallest_magnitude(den)
    limit = FLOAT_MAX.get(ev.dtype)
    if smallest is None or limit is None or ev.dtype == "float16" or not ev.made_inf() or not ev.inputs_finite():
        return None  # (float16's narrow range makes ordinary quotients overflow: fp16_overflow's)
    numerator = 1.0 if num is None else max(abs(num.min or 0.0), abs(num.max or 0.0))
    moderate = numerator <= math.sqrt(limit) and smallest <= 1 / math.sqrt(limit)
    if not moderate or numerator / smallest < limit:
        return None  # a large numerator, or a divisor that is merely small: an overflow
    return Cause(
        "div_by_zero",
        "division by a value that is zero in all but name",
        f"At {ev.where} ({ev.code}) the smallest denominator is {fmt(smallest)}: not 0, but so close to it that "
        f"dividing by it exceeds {ev.dtype}'s range ({fmt(limit)}) although no numerator is larger than "
        f"{fmt(numerator)}. Result: {_out(ev)}. Such a value is usually one that underflowed (a softmax "
        "probability, an exp of a large negative number).",
        "Guard the denominator: `x / d.clamp_min(eps)` or `x / (d + eps)`; for inverse probabilities, clamp the "
        "probability (`1 / p.clamp_min(1e-6)`), or normalise the weights in log space: `(1 / p) / (1 / p).sum()` is "
        "`torch.softmax(-log_p, 0)`, which never forms 1 / p.",
    )


def _smallest_magnitude(summary) -> float | None:
    """The smallest |x| of a summary's finite values, when min and max tell it (one sign)."""
    if summary.min is None or summary.max is None:
        return None
    if summary.min > 0:
        return summary.min
    if summary.max < 0:
        return -summary.max
    return None


@op_rule("nll_loss_forward", "nll_loss2d_forward")
def mean_over_no_targets(ev: Evidence) -> Cause | None:
    """A mean cross-entropy / NLL whose every target is `ignore_index` (or weighs 0) divides
    0 by 0: a batch whose labels were all masked (-100 for padding, prompts, truncation)."""
    if ev.facts.counted_targets != 0:
        return None
    ignored = ev.facts.ignore_index
    return Cause(
        "div_by_zero",
        "mean loss over zero targets: every target is ignore_index",
        f"At {ev.where} ({ev.code}) the loss averages over the targets that count, and none does: every "
        f"target is {ignored} (`ignore_index`) or has class weight 0, so the mean is 0/0 = NaN. Typical of "
        "a batch whose labels were all masked: padding only, a prompt with its answer truncated away.",
        "Skip batches with no counted target (`if (labels != -100).any():`), or reduce with "
        "`reduction='sum'` and divide by `max(count, 1)`; check the truncation that leaves answers empty.",
    )


@op_rule("mean", "mse_loss", "smooth_l1_loss", "huber_loss", "soft_margin_loss", "l1_loss",
         "binary_cross_entropy", "binary_cross_entropy_with_logits")
def mean_of_nothing(ev: Evidence) -> Cause | None:
    """A mean over no values is 0/0: a boolean selection that picked nothing, whether the
    script takes the mean or a loss does (`reduction='mean'`)."""
    if ev.facts.reduced_count != 0:
        return None
    averaging = "`mean`" if ev.op == "mean" else f"`{ev.op}` (reduction='mean')"
    return Cause(
        "div_by_zero",
        "mean over zero values: an empty selection",
        f"At {ev.where} ({ev.code}) {averaging} averages over 0 values, which is 0/0 = NaN. Typical of a boolean "
        "selection that picked nothing: `x[labels == c].mean()` for a class absent from the batch, a mask with "
        "no True entry, an empty batch.",
        "Skip empty selections (`if mask.any():`), or sum and divide by the count kept at least 1: "
        "`x[mask].sum() / mask.sum().clamp(min=1)`.",
    )


@op_rule("std", "var", "std_mean", "var_mean")
def spread_of_too_few_values(ev: Evidence) -> Cause | None:
    """std/var divide the squared deviations by N - correction: with Bessel's correction a
    spread over one value is 0/0 (a batch of one, a last batch of size 1, a 1-wide dim)."""
    count, correction = ev.facts.reduced_count, ev.facts.correction
    if count is None or correction is None or count - correction > 0:
        return None
    weight = ev.facts.parameter is not None or _a_weight(ev)
    # Prepared before any batch (statistics per subject, class or group, computed up front):
    # a group of one row, not a short batch.
    grouped = not weight and ev.root.phase == "data" and ev.facts.batch is None
    return Cause(
        "div_by_zero",
        f"{ev.op} over {count} value{'s' if count != 1 else ''}: no degrees of freedom left",
        f"At {ev.where} ({ev.code}) each output of {ev.op} reduces over {count} value{'s' if count != 1 else ''} "
        f"with correction={correction:g}, so it divides by N - correction = {count - correction:g}: "
        f"{_out(ev)}. " + ("The values are a weight's: a dimension of size 1 (one input channel, a fan-in of 1) "
                           "has no spread." if weight else
                           "The data is being prepared: a group with a single row (a subject, a class, a series "
                           "recorded once) has no spread to standardise by." if grouped else
                           "Typical of a batch of one (the last, short batch of an epoch) normalised over the batch."),
        ("Use the population spread, `w.std(dim, correction=0)`, with an epsilon before dividing by it, or leave "
         "layers with a single input out of the standardisation." if weight else
         "Handle groups of one row: skip or merge them, fall back to the whole dataset's spread for them, or use "
         "the population spread, `g.std(dim, correction=0)`, with a floor before dividing by it "
         "(`.clamp_min(1e-6)`)." if grouped else
         "Drop short batches (`DataLoader(..., drop_last=True)`), skip the normalisation when there is a "
         "single value, or use the population spread: `x.std(dim, correction=0)` (add an epsilon before dividing by it)."),
    )


def _a_weight(ev: Evidence) -> bool:
    """Is the reduced value a weight (`w.std(...)` in a weight standardisation)?"""
    return bool(re.search(r"\b(?:weight|w)\.(?:std|var)\(", ev.code or ""))


# A divisor written as a spread of values: `x.std(0)`, `torch.var(x)`, `(x.max() - x.min())`.
# The names people give a spread too: `sd`, `feature_std`, `var_y`, `stddev` (not a learned
# `sigma`: a scale the model predicts is no spread of constant data).
_RANGE = r"\ba?max\b[^/]*-[^/]*\ba?min\b"
_SPREAD = re.compile(r"\b(?:\w+_)?(std|var|sd|stdev|stddev|variance)(?:_\w+)?\b|" + _RANGE)


def _divides_by_a_spread(ev: Evidence) -> bool:
    """Does the line divide by a std, a variance, a root mean square or a max - min (which
    a constant, or for the root mean square an all-zero slice, makes 0)? Read from the code
    when autograd did not record what made the divisor (no_grad): on the line, or where the
    variable it divides by was assigned just above it (`sigma = past.std()` then
    `(x - mu) / sigma`)."""
    divisor, location = _divisor(ev)
    if divisor is None:
        return False
    written = _divisor_as_written(divisor, location)
    return bool(_SPREAD.search(written) or _VARIANCE_BY_HAND.search(written) or _MEAN_SQUARE.search(written)) \
        or _a_range_of_names(divisor, location)


def _divisor_as_written(divisor: str, location) -> str:
    """The divisor's text and, where it is a name (`x / rms * w`), the value assigned to it above."""
    name = re.match(r"=?\s*\(?\s*(?:(?:torch\.)?sqrt\(\s*)?([A-Za-z_]\w*)\s*\)?\s*\)?\s*(?:$|[#,)\]+*])", divisor)
    return divisor + (" " + _assigned_above(location.file, location.line, name.group(1)) if name else "")


def _divides_by_a_mean_square(ev: Evidence) -> bool:
    divisor, location = _divisor(ev)
    return divisor is not None and bool(_MEAN_SQUARE.search(_divisor_as_written(divisor, location)))


# A variance written out: the mean of squared deviations (`(h - u).pow(2).mean(-1)`,
# `((x - mu) ** 2).mean()`), whatever the names (ConvNeXt's LayerNorm calls it `s`); or
# the square of a sum or mean taken from a sum of squares (`N * sum_x2 - torch.pow(sum_x,
# 2)` in a Pearson correlation, `ex2 - mu ** 2`, `(x**2).mean() - x.mean() ** 2`). Not any
# difference of squares: `1 - v ** 2` is no spread.
_SUM_LIKE = r"[\w.\[\]]*(?:sum|mean|avg|\bmu\b|\bm\b)[\w.\[\]]*(?:\([^()]*\))?"
_VARIANCE_BY_HAND = re.compile(
    r"\([^()]*-[^()]*\)\s*(?:\*\*\s*2|\.pow\(\s*2\s*\)|\.square\(\s*\))\s*\)?\s*\.mean\("
    r"|-\s*(?:torch\.(?:pow|square)\(\s*" + _SUM_LIKE + r"\s*(?:,\s*2\s*)?\)"
    r"|" + _SUM_LIKE + r"\s*(?:\*\*\s*2|\.pow\(\s*2\s*\)|\.square\(\s*\)))")


# A root mean square written out (RMSNorm by hand: `x.pow(2).mean(-1, keepdim=True).sqrt()`),
# 0 over an all-zero slice (a padding row) as a std is over a constant one: the same
# normalisation without its epsilon, whether spelled `x / rms` or `x * torch.rsqrt(ms)`.
_MEAN_SQUARE = re.compile(r"(?:\*\*\s*2|\.pow\(\s*2\s*\)|\.square\(\s*\))\s*\)?\s*\.mean\(")


def _divides_by_a_range(ev: Evidence) -> bool:
    """Is the divisor a max - min (`t.max() - t.min()`, `hi - lo` of a max and a min)?"""
    divisor, location = _divisor(ev)
    return divisor is not None and (bool(re.search(_RANGE, divisor)) or _a_range_of_names(divisor, location))


def _divisor(ev: Evidence):
    """(what the root's line divides by, as written, and the line's location), or (None, location)."""
    location = ev.root.location
    code = location.code if location else ""
    return (code.split("/", 1)[1] if "/" in code else None), location


def _a_range_of_names(divisor: str, location) -> bool:
    """`(hi - lo)` where `hi` was assigned a max and `lo` a min above (`lo, hi = x.min(0).values,
    x.max(0).values`), or names that say so (`x_max - x_min`): a min-max range."""
    names = re.match(r"\s*\(?\s*([A-Za-z_]\w*)\s*-\s*([A-Za-z_]\w*)\s*\)?", divisor)
    if not names:
        return False
    high, low = names.groups()
    said = [name + " " + _assigned_above(location.file, location.line, name) for name in (high, low)]
    return bool(re.search(r"max", said[0], re.IGNORECASE) and re.search(r"min", said[1], re.IGNORECASE))


def _assigned_above(file: str, line: int, name: str, reach: int = 30) -> str:
    """The value of the nearest assignment to `name` above `line` in the same function
    (`sigma = x.std()`, or its part of `mu, sigma = x.mean(), x.std()`)."""
    assignment = re.compile(r"^\s*([\w\s,]+?)\s*=(?!=)(.*)$")
    for number in range(line - 1, max(0, line - reach), -1):
        text = linecache.getline(file, number)
        if re.match(r"\s*(def|class)\s", text):
            break
        found = assignment.match(text)
        targets = [t.strip() for t in found.group(1).split(",")] if found else []
        if name in targets:
            values = found.group(2).split(",")  # (good enough for a tuple of calls without commas inside)
            return values[targets.index(name)] if len(values) == len(targets) else found.group(2)
    return ""


def zero_variance(ev: Evidence) -> Cause:
    low_precision = ev.dtype in ("bfloat16", "float16")
    if _divides_by_a_range(ev):
        return Cause(
            "zero_variance",
            "division by a zero range (max - min)",
            f"At {ev.where} ({ev.code}) the denominator is a range, max - min, that is 0 for some slices (constant "
            f"inputs: an empty mask, a flat image, a constant column), so the min-max scaling divides by zero: "
            f"{_out(ev)}.",
            "Guard the range: `(x - lo) / (hi - lo).clamp_min(eps)`, or skip the scaling where `hi == lo` "
            "(`torch.where(hi > lo, (x - lo) / (hi - lo), torch.zeros_like(x))`, with the safe divisor inside).",
        )
    if _divides_by_a_mean_square(ev):
        return Cause(
            "zero_variance",
            "division by a zero root mean square",
            f"At {ev.where} ({ev.code}) the denominator is a root mean square, sqrt(mean(x²)), that is 0 for slices "
            f"that are all zero (padding rows, an embedding row of zeros, a dead channel), so the normalisation "
            f"divides by zero: {_out(ev)}. An RMSNorm without its epsilon.",
            "Add an epsilon inside the root: `x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)`, or use "
            "`torch.nn.RMSNorm(dim, eps=1e-6)`.",
        )
    return Cause(
        "zero_variance",
        "division by a zero standard deviation / variance",
        f"At {ev.where} ({ev.code}) the denominator is a std/var that is 0 for some slices "
        + (f"(constant inputs, or in {ev.dtype} a variance that cancelled: E[x²] − E[x]² of values far from 0 "
           "rounds to 0 with 8 to 11 bits of precision)" if low_precision else "(constant inputs)")
        + f", so the normalisation divides by zero: {_out(ev)}.",
        _first("Compute the statistics in float32 (`x.float().var(dim)`, or `torch.var_mean`, which does not "
               "cancel), then cast back;" if low_precision else None,
               "Add an epsilon inside the normalisation: `(x - mean) / (std + 1e-5)` or `x * torch.rsqrt(var + 1e-5)`, "
               "or use `F.layer_norm` / `nn.BatchNorm*`, which do."),
    )


@op_rule("native_layer_norm", "layer_norm", "native_group_norm", "group_norm", "native_batch_norm",
         "_native_batch_norm_legit", "_native_batch_norm_legit_no_training", "batch_norm", "instance_norm",
         "rms_norm", "_fused_rms_norm")
def norm_without_epsilon(ev: Evidence) -> Cause | None:
    """A normalisation layer that made NaN from finite inputs: a constant slice (zero padding,
    a blank frame) has variance 0, and with eps = 0 (Keras `epsilon=0.0`, `nn.LayerNorm(d,
    eps=0)`) the layer computes (x - mean) / sqrt(0) = 0/0."""
    if not ev.made_nan() or not ev.inputs_finite():
        return None
    return Cause(
        "zero_variance",
        "a normalisation layer without epsilon over a constant slice",
        f"At {ev.where} ({ev.code}) `{ev.op}` made NaN from finite inputs ({_out(ev)}): a slice it normalises is "
        "constant (zero padding, a blank frame, a dead channel), so its variance is 0, and with an epsilon of 0 "
        "the layer divides by sqrt(0 + 0): (x - mean) / 0 = 0/0.",
        "Keep the layer's epsilon above zero (`nn.LayerNorm(d, eps=1e-5)`, Keras `LayerNormalization(epsilon=1e-3)`, "
        "the defaults), or mask the padding out before normalising.",
    )


@op_rule("_linalg_slogdet", "linalg_slogdet", "slogdet", "logdet")
def logdet_of_singular_matrix(ev: Evidence) -> Cause | None:
    """slogdet's log|det| is -inf where the determinant is 0 (`torch.logdet` and
    `MultivariateNormal.log_prob` go through it)."""
    out = ev.output
    if out is None or not out.neginf:
        return None
    return Cause(
        "log_nonpositive",
        "log-determinant of a singular matrix",
        f"At {ev.where} ({ev.code}) some matrices are singular (linearly dependent or repeated rows or columns), so "
        f"their determinant is 0 and its log is -inf: {_out(ev)}.",
        "Keep the matrix positive definite: add a ridge (`A + eps * torch.eye(n)`), or build it as "
        "`L @ L.mT + eps * I`; where rows can repeat (a DPP kernel over a basket that holds an item twice), "
        "remove the duplicates first.",
    )


@op_rule("_weight_norm_interface", "_weight_norm", "_weight_norm_differentiable_backward")
def weight_norm_of_a_zero_direction(ev: Evidence) -> Cause | None:
    """weight_norm's w = g * v / ||v||: a row of v that is all zeros is 0 / 0."""
    v = ev.input("v")
    if v is None or not v.zeros:
        return None
    return Cause(
        "div_by_zero",
        "weight_norm of a weight that is all zeros",
        f"At {ev.where} ({ev.code}) a weight_norm'd layer computes w = g * v / ||v||, and its direction v has "
        f"{count_of(v.zeros, v)} zeros (a zero-initialised weight, e.g. to start a residual branch at zero): "
        f"||v|| = 0 for some rows, so w is 0 / 0: {_out(ev)}.",
        "Zero-initialise the magnitude instead of the direction: keep v random and set `g` (the parametrization's "
        "`original0`, or `weight_g`) to 0, which starts the branch at zero with a defined gradient.",
    )


@op_rule("scalar_tensor")
def logdet_of_negative_determinant(ev: Evidence) -> Cause | None:
    """A NaN torch wrote itself inside the function the line called (`scalar_tensor(nan)`,
    where the result is undefined): `torch.logdet` does so for a negative determinant."""
    code = ev.root.location.code if ev.root.location else ""
    if "logdet" not in code:
        return None
    return Cause(
        "log_nonpositive",
        "logdet of a matrix whose determinant is negative",
        f"At {ev.where} ({ev.code}) `logdet` is the log of the determinant, and some matrices have a negative "
        "determinant: torch returns NaN for them (log of a negative number). A matrix meant to be a covariance or "
        "precision is not positive definite, or an unconstrained parameter's determinant changed sign.",
        "Use `torch.linalg.slogdet(A)` and handle sign <= 0, or keep the matrix positive definite by construction "
        "(`L @ L.mT + eps * I`, with `logdet = 2 * torch.linalg.cholesky(S).diagonal(dim1=-2, dim2=-1).log().sum(-1)`).",
    )


@op_rule("exp", "exp2", "expm1", "sinh", "cosh")
def exp_overflow(ev: Evidence) -> Cause | None:
    x = ev.input("self") or ev.first_input()
    limit = EXP_LIMIT.get(ev.dtype, 88.72)
    if x is None or x.max is None:
        return None
    hyperbolic = ev.op in ("sinh", "cosh")  # e^|x| / 2: as large for -x as for x
    peak = max(abs(x.min), abs(x.max)) if hyperbolic else x.max
    if peak <= limit * 0.99:
        return None
    blew_up = _weights_blew_up(ev, peak)
    largest = "largest magnitude of an input" if hyperbolic else "largest input"
    if ev.dtype == "float16" and peak <= EXP_LIMIT["float32"] * 0.99 and not blew_up:
        return _exp_past_float16(ev, peak, largest)
    return Cause(
        "exp_overflow",
        f"{ev.op} overflow: inputs {'beyond ±' if hyperbolic else 'above '}{limit} in {ev.dtype}",
        f"At {ev.where} ({ev.code}) the {largest} to {ev.op} is {fmt(peak)}; exp of anything above {limit} "
        f"is Inf in {ev.dtype} ({_out(ev)}). Later arithmetic on the Inf (inf/inf, 0*inf in backward) makes NaN."
        + blew_up,
        _first("Lower the learning rate (10-100x) and clip gradients (`clip_grad_norm_(params, 1.0)`); also," if blew_up
               else None,
               _first("For a log-cosh loss, `log(cosh(x))` is `x.abs() + F.softplus(-2 * x.abs()) - math.log(2)`, "
                      "finite everywhere; otherwise" if ev.op == "cosh" else None,
                      "Subtract the max before exponentiating (`torch.softmax`, `torch.logsumexp`, `F.log_softmax` "
                      "do it for you), keep the computation in log space (`c * torch.exp(-a)` as "
                      f"`torch.exp(torch.log(c) - a)`), or {_exp_clamp(ev.dtype)}")),
    )


def _exp_past_float16(ev: Evidence, peak: float, largest: str) -> Cause:
    """exp of a moderate value (11.1 to 88) in float16 (autocast, `model.half()`): finite in
    float32, past float16's 65504: the dtype overflowed, not the formula."""
    return Cause(
        "fp16_overflow",
        f"{ev.op} overflows float16: inputs above {EXP_LIMIT['float16']}",
        f"At {ev.where} ({ev.code}) the {largest} to {ev.op} is {fmt(peak)}: exp of it is {fmt(math.exp(peak))}, "
        f"finite in float32 but past float16's largest value, 65504, reached at exp({EXP_LIMIT['float16']}) "
        f"({_out(ev)}). Under float16 (autocast or `.half()`) a softmax or an exp by hand overflows where float32 "
        "would not.",
        "Subtract the max before exponentiating (`torch.softmax` / `torch.logsumexp` do it, and autocast runs them "
        "in float32), or compute the exp in float32: `torch.exp(x.float())`; bfloat16 has float32's range.",
    )


def _exp_clamp(dtype: str) -> str:
    """The clamp that keeps exp finite in `dtype` (float16's range ends at exp(11.09))."""
    if dtype == "float16":
        return "compute it in float32 (`torch.exp(x.float())`); in float16 clamp the exponent: `torch.exp(x.clamp(max=11))`."
    return f"clamp the exponent: `torch.exp(x.clamp(max={700 if dtype == 'float64' else 80}))`."


# No healthy forward feeds exp values this large (a softmax logit is rarely above 100):
# after training began (the same data passed at step 0) they mean the weights themselves
# blew up (a learning rate far too large), not an exp written unsafely.
_BLOWN_UP_EXPONENT = 1e3


def _weights_blew_up(ev: Evidence, largest: float) -> str:
    norms = [g for g in ev.history.grad_norm if g is not None]
    if not ev.step or largest < _BLOWN_UP_EXPONENT or not norms:
        return ""
    return (f" Inputs of {fmt(largest)} after {ev.step} optimizer step{'s' if ev.step != 1 else ''} (the last gradient "
            f"norm was {fmt(norms[-1])}) mean the weights grew out of range: the learning rate is likely too large.")


@op_rule("sqrt", "rsqrt", nodes=("SqrtBackward", "RsqrtBackward"))
def sqrt_rule(ev: Evidence) -> Cause | None:
    if ev.node:
        return Cause(
            "sqrt_zero_backward",
            "sqrt(0) in forward: its gradient is infinite",
            f"The forward line {ev.where} ({ev.code}) takes sqrt of values that are exactly 0. "
            "sqrt(0) = 0 is fine, but its derivative 1/(2*sqrt(x)) is Inf at 0, and the chain rule's 0*Inf "
            f"makes the gradient NaN ({_out(ev)}). Typical for Euclidean distances of a point to itself.",
            "Add an epsilon inside the root: `torch.sqrt(d2 + 1e-12)`, or use `torch.linalg.vector_norm` / "
            "`torch.cdist`, or a safe gradient: `torch.where(d2 > 0, d2, 1).sqrt() * (d2 > 0)`.",
        )
    x = ev.input("self") or ev.first_input()
    if x is None:
        return None
    if x.negatives:
        return Cause(
            "sqrt_negative",
            f"{ev.op} of a negative value",
            f"At {ev.where} ({ev.code}) {count_of(x.negatives, x)} inputs are negative (the smallest is {fmt(x.min)}): "
            f"{ev.op} of a negative number is NaN.",
            "Clamp before the root (`torch.sqrt(x.clamp_min(0) + eps)`), or find why the value went negative "
            "(a variance computed as E[x²]-E[x]² can round below 0: use `torch.var`).",
        )
    if ev.op == "rsqrt" and x.zeros:
        return zero_second_moment(ev, x) if ev.facts.own_optimizer else zero_variance(ev)
    return None


def zero_second_moment(ev: Evidence, x) -> Cause:
    """rsqrt inside an optimizer the script wrote (Adafactor, RMSprop by hand): the second
    moment of a parameter that got no gradient is 0, not a constant input's variance."""
    return Cause(
        "div_by_zero",
        "rsqrt of a second moment that is 0",
        f"At {ev.where} ({ev.code}), inside the script's own optimizer step, {count_of(x.zeros, x)} values under "
        f"rsqrt are 0: 1/sqrt(0) = Inf ({_out(ev)}). A running mean of squared gradients stays 0 where a "
        "parameter gets no gradient (an embedding row never looked up, a head whose loss weight is 0).",
        "Add an epsilon where the update divides by the root: `torch.rsqrt(v + 1e-30)` (Adafactor's eps1) or "
        "`g / (v.sqrt() + 1e-8)`.",
    )


# A power of one half spelled out on the line: `** 0.5`, `**.5`, `** (1/2)`, `.pow(0.5)`.
_HALF = r"\(?\s*(?:0?\.50*|1\.?0*\s*/\s*2\.?0*)\s*\)?(?![\d.])"
_ROOT_SPELLING = re.compile(r"\*\*\s*" + _HALF + r"|pow\((?:[^(),]*,)?\s*" + _HALF)


def _written_as_a_root(ev: Evidence) -> bool:
    """Did the script write this power as a square root (`d2 ** 0.5`), rather than raise to
    an exponent that is a setting of its own that happens to be 0.5 (`(1 - p) ** gamma`,
    a focal loss's gamma below 1)? Unknown source counts as a root."""
    loc = ev.root.location
    return not (loc and loc.code) or bool(_ROOT_SPELLING.search(loc.code))


@op_rule("pow", "float_power", nodes=("PowBackward",))
def pow_invalid(ev: Evidence) -> Cause | None:
    base = ev.input("self") or ev.first_input()
    exponent = ev.input("exponent")
    if ev.node and ev.facts.exponent == -0.5 and _written_as_a_root(ev):
        return sqrt_rule(ev)  # PowBackward of `x ** 0.5` takes x ** -0.5: a square root, written as a power
    if ev.node:
        return Cause(
            "pow_invalid",
            "x ** p with p < 1 at x = 0: infinite gradient",
            f"The forward line {ev.where} ({ev.code}) raises values that are 0 to a power below 1; the derivative "
            f"p * x**(p-1) is Inf at 0 and makes the gradient non-finite ({_out(ev)}).",
            "Add an epsilon to the base (`(x + 1e-8) ** p`) or clamp it (`x.clamp_min(1e-8) ** p`).",
        )
    if base is None:
        return None
    if ev.made_nan() and base.negatives:
        return Cause(
            "pow_invalid",
            "negative base raised to a fractional power",
            f"At {ev.where} ({ev.code}) {count_of(base.negatives, base)} bases are negative (smallest {fmt(base.min)}); "
            "a negative number to a non-integer power is NaN.",
            "Use `x.abs() ** p * x.sign()` if a signed power is meant, or clamp the base: `x.clamp_min(0) ** p`.",
        )
    scalar = ev.facts.exponent
    negative = (scalar is not None and scalar < 0) or (exponent is not None and exponent.min is not None and exponent.min < 0)
    if base.zeros and ev.made_inf() and negative:
        return Cause(
            "pow_invalid",
            "zero raised to a negative power",
            f"At {ev.where} ({ev.code}) {count_of(base.zeros, base)} bases are 0 and the exponent is negative: 0 ** -p is Inf.",
            "Add an epsilon to the base (`(x + eps) ** p`) or clamp it (`x.clamp_min(eps) ** p`).",
        )
    return None


# Each inverse function's domain, the edge where its derivative is Inf, and the clamp that
# keeps it strictly inside (the margin also keeps the gradient finite).
_INVERSE_DOMAINS = {
    "acos": ("[-1, 1]", "±1", "1/sqrt(1-x²)", "torch.acos(x.clamp(-1 + 1e-7, 1 - 1e-7))"),
    "asin": ("[-1, 1]", "±1", "1/sqrt(1-x²)", "torch.asin(x.clamp(-1 + 1e-7, 1 - 1e-7))"),
    "atanh": ("(-1, 1)", "±1", "1/(1-x²)", "torch.atanh(x.clamp(-1 + 1e-6, 1 - 1e-6))"),
    "acosh": ("[1, inf)", "1", "1/sqrt(x²-1)", "torch.acosh(x.clamp_min(1 + 1e-6))"),
}


@op_rule("acos", "asin", "atanh", "acosh",
         nodes=("AcosBackward", "AsinBackward", "AtanhBackward", "AcoshBackward"))
def domain_asin_acos(ev: Evidence) -> Cause | None:
    x = ev.input("self") or ev.first_input()
    name = ev.forward_op if ev.node else ev.op
    domain, edge, derivative, clamp = _INVERSE_DOMAINS.get(name, _INVERSE_DOMAINS["acos"])
    if ev.node:
        return Cause(
            "domain_asin_acos",
            f"{name} at {edge}: infinite gradient",
            f"The forward line {ev.where} ({ev.code}) evaluates {name} at exactly {edge}, where its derivative "
            f"{derivative} is Inf ({_out(ev)}).",
            f"Clamp strictly inside the domain: `{clamp}`.",
        )
    if x is None:
        return None
    lo, hi = (-1.0, 1.0) if name != "acosh" else (1.0, float("inf"))
    below, above = x.min is not None and x.min < lo, x.max is not None and x.max > hi
    if not (below or above):
        return None
    nearest = x.min if below else x.max
    why = (" A cosine similarity of (nearly) identical unit vectors rounds to slightly outside ±1." if name in ("acos", "asin")
           else " A distance computed as acosh of an inner product rounds to just below 1 for a point and itself."
           if name == "acosh" else "")
    return Cause(
        "domain_asin_acos",
        f"{name} outside its domain",
        f"At {ev.where} ({ev.code}) inputs reach {nearest!r} (range [{fmt(x.min)}, {fmt(x.max)}]); {name} is defined "
        f"only on {domain} and gives NaN outside ({_out(ev)}).{why}",
        f"Clamp into the domain: `{clamp}`.",
    )


@op_rule("i0", "special_i0", "special_i1", "special_modified_bessel_i0", "special_modified_bessel_i1")
def bessel_overflow(ev: Evidence) -> Cause | None:
    """I0 and I1 grow like e^x / sqrt(2 pi x): a von Mises concentration or a Rician
    amplitude past about 90 overflows float32 (713 in float64: a wider dtype only moves
    the edge). Their exponentially scaled forms stay finite."""
    x = ev.input("self") or ev.first_input()
    if not ev.made_inf() or x is None or x.max is None:
        return None
    scaled = {"special_i1": "torch.special.i1e", "special_modified_bessel_i1": "torch.special.i1e"}.get(
        ev.op, "torch.special.i0e")
    return Cause(
        "exp_overflow",
        f"{ev.op} overflow: the modified Bessel function grows like exp(x)",
        f"At {ev.where} ({ev.code}) `{ev.op}` of inputs up to {fmt(x.max)} is beyond {ev.dtype}'s range "
        f"({_out(ev)}): I0 and I1 grow like e^x / sqrt(2πx), past about 90 in float32 and 713 in float64, so a "
        "wider dtype only moves the edge (a von Mises concentration that grows as it fits tight data).",
        f"Work in log space with the exponentially scaled form: `log I(x) = torch.log({scaled}(x)) + x` "
        "(finite for any x), or use `torch.distributions.VonMises`, whose log_prob does so.",
    )


@op_rule(nodes=("LinalgSvdBackward", "SvdBackward", "LinalgEighBackward", "SymeigBackward", "LinalgEigBackward"))
def repeated_spectrum_backward(ev: Evidence) -> Cause | None:
    """The gradient through singular vectors (eigenvectors) divides by the differences of
    the squared singular values (eigenvalues): 0 where two are equal, as they are in a
    matrix of low rank (a zero-initialised layer makes many zero singular values)."""
    vectors = "eigenvectors" if "Eig" in (ev.node or "") or "Symeig" in (ev.node or "") else "singular vectors"
    values = "eigenvalues" if vectors == "eigenvectors" else "singular values"
    return Cause(
        "div_by_zero",
        f"gradient through {vectors} at repeated {values}",
        f"The forward line {ev.where} ({ev.code}) differentiates through the {vectors} of a matrix with repeated "
        f"{values}: their gradient divides by the differences of the {values} (squared), 0 for a repeated pair "
        f"({_out(ev)}). A matrix of low rank has many equal (zero) {values}: a zero-initialised layer, a rank-deficient "
        "batch, an identity.",
        f"Differentiate only through what is defined: the {values} alone (`torch.linalg.svdvals`, "
        "`torch.linalg.eigvalsh`); keep the matrix full rank (initialise the layer away from zero, add a small "
        f"`eps * torch.eye(n)`); or, for an orthogonal projection (Procrustes), accept that the {vectors} of equal "
        f"{values} are not unique and stop the gradient through them (`.detach()`).",
    )


@op_rule(nodes=("Atan2Backward",))
def atan2_zero_backward(ev: Evidence) -> Cause | None:
    return Cause(
        "atan2_zero_backward",
        "atan2(0, 0): gradient undefined at the origin",
        f"The forward line {ev.where} ({ev.code}) computes atan2 at points where both arguments are 0; the "
        f"derivative divides by x²+y² = 0 ({_out(ev)}).",
        "Nudge away from the origin: `torch.atan2(y, x + 1e-12)`, or mask zero vectors out of the loss before atan2.",
    )


@op_rule(nodes=("NormBackward", "LinalgVectorNormBackward", "HypotBackward"))
def norm_zero_backward(ev: Evidence) -> Cause | None:
    return Cause(
        "norm_zero_backward",
        "norm of a zero vector: gradient x/||x|| is 0/0",
        f"The forward line {ev.where} ({ev.code}) takes the norm of vectors that are all zeros; the gradient x/||x|| "
        f"is 0/0 there ({_out(ev)}).",
        "Add an epsilon: `torch.sqrt((x**2).sum(-1) + 1e-12)`, or `F.normalize(x, eps=1e-12)` instead of x / x.norm().",
    )


@op_rule("_ctc_loss", "ctc_loss", nodes=("CtcLossBackward",))
def ctc_infeasible(ev: Evidence) -> Cause | None:
    ctc = ev.facts.ctc
    if ctc is None and not ev.node:
        return None
    impossible = ctc.impossible if ctc is not None else ()
    if impossible:
        items = "batch item" if len(impossible) == 1 else "batch items"
        detail = f"{len(impossible)} {items} cannot be aligned: {words.ctc_items(impossible)}."
    else:
        detail = "some batch items have targets longer than their inputs allow."
    return Cause(
        "ctc_infeasible",
        "CTC target longer than its input",
        f"At {ev.where} ({ev.code}) CTC needs input_length >= target_length + repeated labels; {detail} "
        "Their loss is Inf and its gradient NaN.",
        "Pass `zero_infinity=True` to `F.ctc_loss` / `nn.CTCLoss`, and filter such utterances in the dataset "
        "(check `input_lengths >= target_lengths` after downsampling).",
    )


# `torch.triu(x, diagonal=1)`, `x.triu(1)`, `torch.triu(x, 1)`: a causal mask above the diagonal.
_ABOVE_THE_DIAGONAL = re.compile(r"diagonal\s*=\s*[1-9]|triu\(\s*[1-9]\s*\)|\)\s*,\s*[1-9]\s*\)")


def _masks_the_diagonal(code: str | None) -> bool:
    """Is the line a `triu` of -inf that keeps the diagonal masked (the default diagonal=0)?"""
    return bool(code) and "triu(" in code and not _ABOVE_THE_DIAGONAL.search(code)


@op_rule(*SOFTMAX_OPS)
def softmax_all_masked(ev: Evidence) -> Cause | None:
    x = ev.input("self") or ev.first_input()
    if x is not None and x.posinf and ev.made_nan():
        source = words.inf_source(ev.facts)
        return Cause(
            "inf_arithmetic",
            "softmax over a row that holds +inf",
            f"At {ev.where} ({ev.code}) the softmax input holds {count_of(x.posinf, x)} +inf values: a row with a "
            f"+inf is exp(inf - inf) = NaN ({_out(ev)}). A mask is -inf, never +inf."
            + (f" The +inf was written at {source}: a -inf mask negated, or a value written as +inf." if source else ""),
            "Mask scores with -inf (`scores.masked_fill(~valid, float('-inf'))`) and negate distances before the "
            "mask, not after (`softmax((-dist).masked_fill(~valid, float('-inf')), -1)`).",
        )
    if x is None or not x.neginf or not ev.made_nan():
        return None
    written = ev.facts.inf_written_at
    diagonal = (written is not None and _masks_the_diagonal(written.code)) or _first_query_keyless_everywhere(ev.facts)
    return Cause(
        "inf_arithmetic",
        "softmax over a row that is entirely -inf",
        f"At {ev.where} ({ev.code}) some rows of the softmax input are -inf everywhere (fully masked); "
        f"exp(-inf - (-inf)) is NaN ({_out(ev)})."
        + (f" The -inf was written at {words.inf_source(ev.facts)}." if words.inf_source(ev.facts) else "")
        + (" The first query (row 0) of every score matrix has all its keys masked, and no other row does: the "
           "causal mask hides the diagonal too (`triu` without `diagonal=1`, or `j >= i`), so position 0 may "
           "attend to nothing." if diagonal else _mask_shape_leaves_rows_keyless(ev.facts)),
        ("A causal mask hides only the future: `torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)` "
         "(True = masked), keeping each position's own score. " if diagonal or ev.facts.keyless_in_every_matrix
         else "") + _ROWS_WITH_NOTHING,
    )


def _first_query_keyless_everywhere(facts) -> bool:
    # (A list once the facts have come back from a replay's JSON report.)
    return tuple(facts.keyless_queries or ()) == (0,) and facts.keyless_in_every_matrix


def _mask_shape_leaves_rows_keyless(facts) -> str:
    """The same query rows keyless in every sequence: the mask's shape, not the data's padding."""
    rows = facts.keyless_queries
    if not rows or not facts.keyless_in_every_matrix:
        return ""
    shown = ", ".join(str(r) for r in rows[:8]) + (", ..." if len(rows) > 8 else "")
    return (f" The same query rows ({shown}) have every key masked in every score matrix of the batch: the mask "
            "itself leaves them nothing, whatever the data (a mask that hides the past instead of the future, "
            "or the diagonal with it).")


_ROWS_WITH_NOTHING = (
    "Handle the rows with nothing to attend to (an empty set, an all-padding sequence): drop them from the "
    "batch, or give them finite scores before the softmax and zero weights after it (`any_valid = "
    "valid.any(-1, keepdim=True); w = torch.softmax(torch.where(any_valid, masked, 0.0), -1) * any_valid`), "
    "or keep one position always valid (a CLS/null token). A finite fill (`torch.finfo(x.dtype).min`) only hides "
    "the NaN: such a row then attends uniformly to padding.")


@op_rule(*ATTENTION_OPS)
def attention_all_masked(ev: Evidence) -> Cause | None:
    """A fused attention (nn.TransformerEncoderLayer's and nn.MultiheadAttention's fast path in
    eval, F.scaled_dot_product_attention) whose -inf mask leaves a query no key."""
    mask = ev.input("mask", "attn_mask")
    others = [s for s in ev.root.inputs if s is not mask]
    if mask is None or not mask.neginf or not ev.made_nan() or any(s.nonfinite for s in others):
        return None
    source = words.inf_source(ev.facts)
    return Cause(
        "inf_arithmetic",
        "attention for a query whose every key is masked",
        f"At {ev.where} ({ev.code}) `{ev.op}` was given a -inf mask ({count_of(mask.neginf, mask)}) and made NaN "
        f"({_out(ev)}) from finite inputs: a query whose every key is masked takes a softmax over nothing, "
        "exp(-inf - (-inf)) = NaN. Left padding under a causal mask does it (a leading pad position may attend "
        "only to padding), as does a sequence that is all padding. The fused kernels of `nn.TransformerEncoderLayer` "
        "and `nn.MultiheadAttention` in eval mode give such rows NaN even where the training path did not."
        + (f" The -inf was written at {source}." if source else ""),
        "With a causal mask, pad on the right, or leave each position its own key unmasked. " + _ROWS_WITH_NOTHING,
    )
