"""Rules about the run rather than the op: they outrank the op rules.

A NaN that arrived in a batch is a data problem whatever op first touched it; a masked
Inf that leaks NaN into the gradient is a pattern, not a division problem; a parameter
that was already non-finite, or an update the optimizer made from finite gradients.
"""
from __future__ import annotations

import dataclasses
import re

from nandoctor.detect.result import OVERWRITTEN_SUFFIX
from nandoctor.diagnose import words
from nandoctor.diagnose.evidence import Evidence, count_of
from nandoctor.diagnose.registry import context_rule, rule_for
from nandoctor.diagnose.rules.fallback import fp16_overflow
from nandoctor.diagnose.rules.ops import attention_all_masked, softmax_all_masked
from nandoctor.report.model import Cause


@context_rule
def made_on_an_unwatched_thread(ev: Evidence) -> Cause | None:
    """The script trains on a thread of its own: the per-op watch saw none of its ops, so
    the first sight of the value is no cause (it did not come from outside torch)."""
    thread = ev.facts.unwatched_thread
    if thread is None:
        return None
    return Cause(
        "unknown",
        "made on a thread whose ops nandoctor does not follow",
        f"The script trains on a thread of its own (`{thread}`). Trace mode checks each op of the thread that "
        f"runs the script, and sees a thread the script starts only at its training boundaries: it first saw "
        f"this value at {ev.where} ({ev.code}), {_bad(ev.output)}, made by an op on that thread before this line.",
        "Call the training function on the script's own thread under nandoctor (`train()` rather than "
        "`threading.Thread(target=train).start()`) to find the op that made it.",
    )


@context_rule
def scaler_step_bypassed(ev: Evidence) -> Cause | None:
    """A GradScaler's scaled gradients overflow float16 now and then by design; only its own
    `step()` skips those steps. The optimizer's `step()` called directly takes them."""
    if not ev.event.facts.scaled_gradient_stepped:
        return None
    return Cause(
        "fp16_overflow",
        "the optimizer stepped on scaled gradients no GradScaler checked",
        "The loss was scaled with `scaler.scale(loss)`, and its scaled gradients overflowed float16 in "
        "backward (the root below). That is how a GradScaler finds the largest scale that fits: "
        "`scaler.step(optimizer)` skips such a step and `scaler.update()` lowers the scale. Here "
        f"`optimizer.step()` was called itself, on gradients holding {_bad(ev.event.output)}: they went into "
        "the update.",
        "Step through the scaler: `scaler.step(optimizer)` then `scaler.update()`, in place of `optimizer.step()` "
        "(keep `scaler.unscale_(optimizer)` before clipping).",
    )


@context_rule
def amp_scale_collapse(ev: Evidence) -> Cause | None:
    amp = ev.facts.amp
    if amp is None:
        return None
    # What the op itself says, when a rule knows it: the reason the gradients stay non-finite
    # (a float16 overflow is every op's: autocast's cast of an input too large for it).
    op_rule = rule_for(ev)
    op_cause = (op_rule(ev) if op_rule is not None else None) or fp16_overflow(ev)
    if amp.nonfinite_losses_in_a_row and op_cause is not None:
        return None  # the loss itself went non-finite: the op's own cause says why
    origin = (f"The first non-finite value in the last backward: {op_cause.title} ({op_cause.id}) at {ev.where}."
              if op_cause is not None else
              f"The first non-finite value in the last backward was made by `{ev.op or 'an unseen op'}` at {ev.where}.")
    if amp.nonfinite_losses_in_a_row:
        return Cause(
            "amp_scale_collapse",
            "the loss is non-finite step after step: the GradScaler skips every step",
            f"The loss was non-finite before scaling {amp.nonfinite_losses_in_a_row} steps in a row, so the "
            f"GradScaler skipped each of them ({amp.skipped} of {amp.steps} skipped so far) and the weights no "
            f"longer change. No loss scale fixes a loss that is non-finite itself. {origin}",
            "Run one step in float32 (disable autocast) to see whether the model or the data makes it; under "
            "float16 keep inputs and activations small (normalise them) or use bfloat16.",
        )
    scale = f" and its scale fell to {amp.scale:g}" if amp.scale is not None else ""
    return Cause(
        "amp_scale_collapse",
        "the GradScaler keeps skipping steps: the gradients are non-finite even unscaled",
        f"The GradScaler skipped {amp.skipped_in_a_row} step{'s' if amp.skipped_in_a_row != 1 else ''} in a row ({amp.skipped} of "
        f"{amp.steps} so far){scale}. Skipping a step and halving the scale is how it handles an overflow of "
        f"the scaled gradients; once the scale is 1 or less the gradients are non-finite without any scaling, "
        f"which no loss scale can fix, and training makes no progress. {origin}",
        (op_cause.fix + " " if op_cause is not None else "") +
        "Check the loss and the model in float32 (disable autocast for one step): a NaN there is a bug in the "
        "model, not an fp16 range problem.",
    )


@context_rule
def optimizer_invalid(ev: Evidence) -> Cause | None:
    if ev.facts.optimizer_setting is not None:
        return _nonfinite_setting(ev)
    if ev.root.phase != "optimizer" and not ev.facts.written_by_optimizer:
        return None
    op_rule = rule_for(ev)
    if ev.facts.own_optimizer and op_rule is not None and op_rule(ev) is not None:
        return None  # the script's own step() code: the op's cause, at its line, not a setting
    return Cause(
        "optimizer_invalid",
        "the optimizer made a non-finite update from finite gradients",
        (f"Inside `optimizer.step()` ({_step_called(ev)}), `{ev.op}` turned finite gradients and state into "
         f"{_bad(ev.output)}: {_bad_inputs(ev) or 'its inputs were finite'}. " if ev.root.phase == "optimizer" else
         f"{words.capitalised(words.parameter_phrase(ev.facts.parameter))} became non-finite in an optimizer step although its gradients were "
         f"finite; it was first used at {ev.where} ({ev.code}). ")
        + ("The weights are float16: Adam's default eps=1e-8 rounds to 0 there (the smallest float16 is 6e-8) and "
           "squared gradients below about 2e-4 underflow to 0, so the update divides by sqrt(v) + eps = 0 although "
           "eps is set." if ev.dtype == "float16" else
           "An optimizer setting is invalid, e.g. Adam/RMSprop with eps=0 divides by sqrt(v)=0 where a gradient is 0."),
        ("Keep the weights and the optimizer in float32 and run the forward in float16 under "
         "`torch.autocast(device_type, dtype=torch.float16)` with `torch.amp.GradScaler` (or bfloat16); a model "
         "trained in pure float16 needs eps >= 1e-4." if ev.dtype == "float16" else
         "Check the optimizer's hyper-parameters: eps > 0 (1e-8; 1e-6 or more under float16), a finite, positive lr, "
         "betas < 1, weight_decay >= 0."),
    )


def _nonfinite_setting(ev: Evidence) -> Cause:
    """A param group's setting (its learning rate, mostly) was non-finite at the step: every
    update with it is non-finite, whatever the gradients."""
    setting = ev.facts.optimizer_setting
    made = (f"numpy made it at {ev.where} ({ev.code}): \"{ev.facts.made_by_numpy}\". " if ev.facts.made_by_numpy
            else f"It was made at {ev.where} ({ev.code}). " if ev.root.op else "")
    return Cause(
        "optimizer_invalid",
        f"the optimizer's `{setting}` is non-finite",
        f"A param group's `{setting}` was NaN or Inf when `optimizer.step()` ran, so every update with it is "
        f"non-finite, whatever the gradients. {made}Typical of a schedule computed by hand past its end: "
        "`(1 - it / max_iter) ** 0.9` of a negative base once `it > max_iter`, a warmup that divides by 0 steps.",
        "Keep the schedule in range: clamp its progress (`max(0.0, 1 - it / max_iter)`), size it from the real "
        "number of steps (epochs x batches), or use `torch.optim.lr_scheduler` (PolynomialLR, LambdaLR).",
    )


def _step_called(ev: Evidence) -> str:
    """Where the step was called from, or, when a framework's loop called it, where the
    optimizer was made (the location then)."""
    if ev.facts.optimizer_made_here:
        return f"called by the framework's training loop, of the optimizer made at {ev.where} ({ev.code})"
    return f"called at {ev.where}"


@context_rule
def masked_inf_gradient_leak(ev: Evidence) -> Cause | None:
    node = ev.facts.gradient_leak_through
    if not node or _entered_torch(ev):
        return None  # (NaN data dropped after the fact: nonfinite_input_data, which tells the leak)
    if ev.root.phase == "data":
        return None  # (made while preparing data, a target normalised by its own zero sum: the op's own bug)
    if _log_of_softmax(ev):
        return None  # (log(softmax) whose 0 a loss's pick left out: no mask of the user's, a log of 0)
    if rule_for(ev) in _ROW_RULES and rule_for(ev)(ev) is not None:
        return None  # (a softmax row with nothing to attend to made the NaN itself: the row's fix, not a where)
    if ev.facts.absorbed and not ev.facts.masked:
        own = _absorbed_by_accident(ev, node)
        if own is not None:
            return own
    out = ev.output
    infs = (out.posinf + out.neginf + out.nan) if out else 0
    return Cause(
        "masked_inf_gradient_leak",
        "a masked Inf leaks NaN into the gradient",
        f"At {ev.where} ({ev.code}) `{ev.op}` makes {count_of(infs, out)} non-finite values in forward. "
        "They are dropped afterwards (by indexing, `where`, a mask, or an op that maps them to finite values, as "
        "exp(-inf) = 0), so the loss is finite, but backward still "
        f"runs through every position: `{node}` computes {_zero_times(node)} = NaN for the dropped ones, and the "
        "NaN reaches the gradients (pytorch issue 4132).",
        "Make the unsafe positions safe BEFORE the op (the double-`where` pattern): " + _safe_before(ev.op),
    )


def _absorbed_by_accident(ev: Evidence, node: str) -> Cause | None:
    """An Inf nothing of the script's dropped: an op downstream only happened to make it
    finite (a GRU's sigmoid and tanh gates saturate at 1 on a price ratio of x/0). The op's
    own cause is the bug, told with what hid it; there is no mask to make safe."""
    rule = rule_for(ev)
    own = rule(ev) if rule is not None else None
    if own is None:
        return None
    return dataclasses.replace(own, explanation=(
        f"{own.explanation} The loss stayed finite: an op downstream happened to make the non-finite values finite "
        f"(exp(-inf) = 0, a saturating gate's sigmoid(+inf) = 1), but backward through them does not: `{node}` gives "
        "NaN, and it reaches the gradients."))


# Op rules for a softmax over a row whose every entry is masked: that op made the NaN.
_ROW_RULES = (softmax_all_masked, attention_all_masked)


def _zero_times(node: str) -> str:
    """What a backward formula makes of a dropped position's zero gradient: divided by the
    zero it divided by (div, log, reciprocal), or times an Inf factor (exp, pow)."""
    return "0/0" if node.startswith(("Div", "Log", "Reciprocal")) else "0 * Inf"


def _log_of_softmax(ev: Evidence) -> bool:
    """log(softmax(x)) whose -inf only a loss's pick of the targets left out (`nll_loss`):
    a softmax that underflowed to 0 and a log of it, the hand-written cross-entropy's bug
    (log_nonpositive, whose fix is the one op that never makes it: log_softmax). Not one a
    `where` or a mask of the script's dropped (`-p * log(p)` over padded attention): that
    is a masked leak, fixed by the double `where`."""
    producer = ev.facts.input_producers.get("self") or ""
    return ev.op.startswith("log") and "Softmax" in producer and not ev.facts.masked


def _safe_before(name: str) -> str:
    """The double-`where` written for the op that made the Inf (its base name, `ev.op`)."""
    if name.startswith("log"):
        return ("`torch.log(torch.where(valid, p, 1.0))` instead of `torch.log(p)`, where `p` is 0 at the dropped "
                "positions (`p * log(p)` is then 0 there, with a zero gradient).")
    if name in ("div", "reciprocal", "true_divide"):
        return ("for `num / den`, with `keep` true where the result is kept: `safe = torch.where(keep, den, "
                "torch.ones_like(den)); out = torch.where(keep, num / safe, 0)`, or select first and divide after: "
                "`num[keep] / den[keep]`.")
    return ("replace the non-finite values by any finite one where they will be dropped (`x = torch.where(valid, x, "
            "0.0)`, `torch.nan_to_num(x, posinf=0.0, neginf=0.0)`) before the arithmetic, not after it.")


@context_rule
def nonfinite_parameter(ev: Evidence) -> Cause | None:
    loaded = ev.facts.loads_parameter and ev.facts.untracked_input
    if not (ev.facts.parameter_before_step and ev.root.op == "") and not loaded:
        return None
    what = words.parameter_phrase(ev.facts.parameter)
    src = (f"It was loaded at {ev.where} ({ev.code})" if loaded else
           f"It was last written at {ev.where} ({ev.code})" if ev.root.location else "No op nandoctor saw made it")
    return Cause(
        "nonfinite_parameter",
        "a buffer was already non-finite" if ev.facts.parameter is not None and ev.facts.parameter.buffer
        else "a parameter was already non-finite",
        f"{words.capitalised(what)} holds {_bad(ev.output)} before training on it. {src}: typically a checkpoint saved after a "
        "NaN, or a hand-made initialisation.",
        "Load a checkpoint from before the failure and validate it (`all(torch.isfinite(t).all() for t in "
        "state_dict.values())`); save checkpoints only after a finite loss.",
    )


@context_rule
def nonfinite_input_data(ev: Evidence) -> Cause | None:
    batch = ev.facts.batch
    if ev.root.phase == "data" and ev.root.op == "" and batch is not None:
        out = ev.output
        where = f"batch {batch.number}" + (f", {batch.key}" if batch.key != "batch" else "")
        indices, rows = batch.dataset_indices, batch.rows
        samples = (f"; dataset indices {list(indices)}" if indices else
                   f"; rows {list(rows)} of the batch" if rows else "")
        again = (" Fetched again in this process, those samples came back finite: what made the value differs "
                 "from one fetch to the next — a random transform (crop, augmentation) that sometimes gives a "
                 "constant or empty image, state inside the worker processes, or data that changed."
                 if batch.refetched_finite else "")
        sentinel = words.inf_source(ev.facts)
        if sentinel:  # an Inf the dataset wrote on purpose, passed on into the batch
            return Cause(
                "nonfinite_input_data",
                "a value the dataset wrote on purpose as ±inf reached a batch",
                f"{where} holds {_bad(out)} before any model op ran{samples}. The Inf was written on purpose at "
                f"{sentinel}, as a marker (never observed, no upper bound, missing), and the Dataset's "
                "`__getitem__` passed it on into the batch: the marker is used as a value (a target, a feature).",
                "Keep the marker out of what the model sees: return a flag with the sample and mask those samples "
                "out of the loss (censored times in a survival loss), or replace the marker before it leaves the "
                "Dataset (a finite cap, a separate indicator feature).",
            )
        return Cause(
            "nonfinite_input_data",
            "a batch arrived from the DataLoader already non-finite",
            f"{where} holds {_bad(out)} before any model op ran{samples}. The data itself contains NaN/Inf, or "
            f"code of the Dataset's that could not be run again here made it.{again}",
            "Find and fix the samples: `nandoctor check-data <your data folder>` scans the files; in the Dataset, "
            "guard normalisations (`x / x.max()` of an all-zero sample) and drop or repair bad records.",
        )
    if ev.facts.untracked_input and ev.root.phase in ("forward", "init", "data") and ev.facts.parameter is None \
            and not ev.facts.written_on_purpose:  # (an Inf sentinel entered on purpose: mask_value_used)
        # Born where it entered torch (`torch.tensor`, `from_numpy`: no inputs), or first
        # seen as an input of an op.
        what = (f"the value entering torch holds {_bad(ev.output)}" if not ev.root.inputs else
                f"an input to `{ev.op or 'the model'}` already held NaN/Inf that no torch op made: {_bad_inputs(ev)}")
        batch = next((site.facts.batch for site in ev.lineage if site.facts.batch is not None), None)
        arrived = (f" It reached training in batch {batch.number}"
                   + (f" (dataset indices {list(batch.dataset_indices)})" if batch.dataset_indices else "") + "."
                   if batch is not None else "")
        leak = ev.facts.gradient_leak_through
        dropped = (f" The loss drops those values (a mask, an index), but backward still runs through them: "
                   f"`{leak}` multiplies a zero gradient by them, and 0 * NaN is NaN in the gradients (pytorch "
                   "issues 4132, 15131)." if leak else "")
        numpy = ev.facts.made_by_numpy
        if numpy:
            cause_id, what_numpy_did = _numpy_cause(numpy, ev.code)
            return Cause(
                cause_id,
                f"numpy made a non-finite value ({what_numpy_did}) that then entered torch",
                f"At {ev.where} ({ev.code}) numpy made {_bad(ev.output)} (\"{numpy}\": {what_numpy_did}); the "
                f"array entered torch with it.{arrived}{dropped}",
                "Guard the numpy computation as you would the torch one: `np.log(np.clip(x, eps, None))` or "
                "`np.log1p(x)` for counts, `np.divide(a, b, out=np.zeros_like(a), where=b != 0)` for a ratio (an "
                "all-zero mask over its own max), `np.clip` before `arccos`; and run with `-W error::RuntimeWarning` "
                "to make numpy raise where it happens.",
            )
        return Cause(
            "nonfinite_input_data",
            "an input was already non-finite when it reached torch",
            f"At {ev.where} ({ev.code}) {what}. It came from outside torch (numpy, pandas, a file, a tensor built "
            f"from Python numbers).{arrived}{dropped}",
            ("Fill the missing values before any op touches them, and keep the mask for the loss: "
             "`valid = ~torch.isnan(y); y = torch.where(valid, y, 0.0)`, then reduce over `valid` only; "
             "or drop those rows from the data." if leak else
             "Check the data before it reaches the model (`nandoctor check-data`), and where it is built: "
             "`assert torch.isfinite(x).all()` after loading. Where values are missing on purpose, drop or mask "
             "those rows (`keep = torch.isfinite(y)`; the loss over `keep` only) rather than fill them: a "
             "`torch.nan_to_num` target trains the model toward the fill value."),
        )
    return None


# numpy's function, from its warning ("... encountered in log") or the line's code, and the
# cause the same torch op would have.
_NUMPY_CAUSES = (
    (re.compile(r"\blog(?:2|10|1p)?\b"), "log_nonpositive", "a log of 0 or of a negative value"),
    (re.compile(r"\barc(?:cos|sin)\b"), "domain_asin_acos", "arccos/arcsin outside [-1, 1]"),
    (re.compile(r"\bsqrt\b"), "sqrt_negative", "a square root of a negative value"),
    (re.compile(r"\bexp(?:2|m1)?\b"), "exp_overflow", "exp of a large value"),
    (re.compile(r"\b(?:divide|true_divide|reciprocal)\b|/"), "div_by_zero", "a division by zero"),
)


def _numpy_cause(message: str, code: str | None) -> tuple[str, str]:
    """(cause id, what numpy did) for numpy's warning `message` at a line of `code`."""
    function = message.rsplit(" encountered in ", 1)[1] if " encountered in " in message else None
    for pattern, cause_id, what in _NUMPY_CAUSES:
        if pattern.search(function or code or ""):
            if cause_id == "div_by_zero" and message.startswith("invalid value"):
                what = "a division 0/0 or inf/inf"  # (numpy's NaN of a division: it does not say which)
            return cause_id, what
    return "nonfinite_input_data", message


@context_rule
def received_from_peers(ev: Evidence) -> Cause | None:
    """A value a collective brought from the other ranks: made there, not here."""
    if not ev.facts.received_from_peers:
        return None
    return Cause(
        "nonfinite_input_data",
        "a non-finite value received from another rank",
        f"At {ev.where} ({ev.code}) `{ev.root.op}` brought {_bad(ev.output)} from the other ranks: no op of this rank "
        "made it. The rank whose own values went non-finite (`culprit_rank`) has the op and the line.",
        "Fix it where the culprit rank made it (its report); a metric reduced over ranks is NaN on every rank as "
        "soon as one rank's share is (`tp / (tp + fn)` on a shard with no positives).",
    )


@context_rule
def mask_value_used(ev: Evidence) -> Cause | None:
    """The root wrote its non-finite value on purpose (`masked_fill(mask, -inf)`), and that
    value itself reached the loss, a gradient or a read: no op made it by accident, so
    neither overflow nor Inf arithmetic is the cause."""
    if _written_by_the_function_the_line_calls(ev):
        return _infinite_by_definition(ev)
    if not ev.facts.written_on_purpose or ev.facts.mask_overflowed:
        return None  # (a finite mask an op pushed past the range: the op overflowed, nothing wrote the -inf)
    if not ev.facts.entered and not _writes_a_special_value(ev.code):
        return _infinite_by_definition(ev)
    if ev.facts.entered and not _assigns_entries(ev.code) or (ev.output is not None and ev.output.posinf
                                                              and not ev.output.neginf):
        return _sentinel_used(ev)
    return Cause(
        "mask_value_used",
        "a -inf written on purpose (a mask) was used as a number",
        f"At {ev.where} ({ev.code}) {'the line' if ev.facts.entered else f'`{ev.op}`'} writes {_bad(ev.output)} "
        "on purpose, as a mask is written. A mask's "
        "-inf is meant to be consumed where it vanishes (softmax, max, `where`); here it reached the value the run "
        "stopped at without passing through one: a sum or mean over masked positions, or a mask added to "
        "something other than scores.",
        "Reduce over the unmasked positions only (`x[~mask].sum()`, `x.masked_fill(mask, 0).sum()`), or write a "
        "large finite negative value instead of -inf: `x.masked_fill(mask, torch.finfo(x.dtype).min)`.",
    )


# What a line that writes an infinity itself shows: a fill or mask call, the infinity, or a
# value that stands for one.
_WRITES_SPECIAL = re.compile(r"fill|mask|inf|full|finfo|tensor\(|empty|where|scatter|index_put|\[.*\]\s*=")


def _writes_a_special_value(code: str) -> bool:
    return bool(_WRITES_SPECIAL.search(code or ""))


# `allowed[i, j] = float("-inf")`: a -inf written into some entries of a tensor is a mask
# (forbidden transitions, blocked positions), not a starting value.
_ASSIGNS_ENTRIES = re.compile(r"\]\s*=[^=]")


def _assigns_entries(code: str) -> bool:
    return bool(_ASSIGNS_ENTRIES.search(code or ""))


def _written_by_the_function_the_line_calls(ev: Evidence) -> bool:
    """The root combined entries (a sum) one of which an Inf written on the same line, by a
    function the line calls (`kl_divergence` writes +inf and sums it): the function's value."""
    written, here = ev.facts.inf_written_at, ev.root.location
    return ev.facts.combined_written_inf and written is not None and here is not None \
        and (written.file, written.line) == (here.file, here.line) and not ev.facts.entered and not _writes_a_special_value(ev.code)


def _infinite_by_definition(ev: Evidence) -> Cause:
    """The fill ran inside a function the line called (torch.distributions' KL writes +inf
    where the second distribution gives probability 0 to an outcome of the first): the
    function's answer is infinite for those inputs, not a mask or sentinel of the script's."""
    return Cause(
        "mask_value_used",
        "a function returned Inf by definition for these inputs",
        f"At {ev.where} ({ev.code}) the function the line calls writes {_bad(ev.output)} itself (`{ev.op}` inside "
        "it): for these inputs its value is infinite by definition, e.g. a KL divergence KL(p || q) where q gives "
        "probability 0 to an outcome p can take. Nothing overflowed; the inputs are outside where it is finite.",
        "Keep the inputs where the function is finite: give every outcome a nonzero probability (smooth or clamp "
        "the probabilities and renormalise, or mask the impossible outcomes out of both distributions), or drop "
        "those terms before they reach the loss.",
    )


def _sentinel_used(ev: Evidence) -> Cause:
    """An infinity written as a starting point (`best = torch.tensor(float("inf"))`, a
    running min or max) that went into arithmetic instead of only into comparisons."""
    return Cause(
        "mask_value_used",
        "an Inf written on purpose (a sentinel) was used as a number",
        f"At {ev.where} ({ev.code}) the script writes {_bad(ev.output)} on purpose, as a starting value "
        "(a best-so-far, a running min or max) is written. Such a sentinel is meant to be compared against and "
        "replaced; here it went into arithmetic and reached the value the run stopped at.",
        "Keep the sentinel out of arithmetic (compare with it: `best = torch.minimum(best, loss)`), or start "
        "from a finite value: `torch.finfo(dtype).max`, or the first real value.",
    )


def _bad(summary) -> str:
    if summary is None:
        return "non-finite values"
    bits = [f"{n} {label}" for label, n in (("NaN", summary.nan), ("+Inf", summary.posinf), ("-Inf", summary.neginf)) if n]
    return " and ".join(bits) + f" (of {summary.numel})"


def _bad_inputs(ev: Evidence) -> str:
    return "; ".join(f"`{s.name}` has {_bad(s)}" for s in ev.root.inputs if s.nonfinite and not s.name.endswith(OVERWRITTEN_SUFFIX))


def _entered_torch(ev: Evidence) -> bool:
    """Was the root a value that entered torch already non-finite (data, not an op's)?"""
    return bool(ev.facts.entered or (ev.facts.untracked_input and not ev.root.inputs and ev.root.phase == "data"))
