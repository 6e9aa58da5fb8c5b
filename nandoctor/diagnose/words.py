"""Words for the typed facts detection hands over: why it stopped, which parameter, where
an intended Inf was written. Used by the rules and by the report's stop reason."""
from __future__ import annotations

from nandoctor.detect.result import CtcItem, Discarded, ParameterRef, Site, SiteFacts, StopReason
from nandoctor.errors import error_message
from nandoctor.report.text import DISCARDED_LISTED, plural, times


def parameter(ref: ParameterRef | None) -> str:
    """`encoder.0.weight`, `param_groups[0].params[1] (3,)` or `a parameter of shape (3,)`."""
    if ref is None:
        return "a parameter"
    if not ref.trained and not ref.name:
        return f"a variable of shape {ref.shape} that nothing trains (requires_grad=False: a metric's or a framework's state)"
    if ref.name:
        return ref.name
    if ref.group is not None:
        return f"param_groups[{ref.group}].params[{ref.index}] {ref.shape}"
    return f"a parameter of shape {ref.shape}"


def parameter_phrase(ref: ParameterRef | None) -> str:
    """`parameter `encoder.0.weight`` when it has a name, else the description alone."""
    if ref is not None and ref.name:
        if ref.buffer:
            return f"buffer `{ref.name}`"
        return f"parameter `{ref.name}`" if ref.trained else f"frozen parameter `{ref.name}` (requires_grad=False)"
    return parameter(ref)


def capitalised(text: str) -> str:
    """The first letter upper-cased, the rest untouched (names keep their case)."""
    return text[:1].upper() + text[1:]


def inf_source(facts: SiteFacts) -> str | None:
    """Where the intended Inf an op consumed was written: `model.py:12 (`code`)` or the op."""
    where = facts.inf_written_at
    if where is not None:
        return f"{where} (`{where.code}`)"
    return facts.inf_written_by


_STOP_REASONS = {
    StopReason.OP_MADE_NAN: "NaN",
    StopReason.OP_MADE_INF: "Inf",
    StopReason.LOSS: "the loss is non-finite",
    StopReason.GRADIENT_RETURNED: "a gradient returned by torch.autograd.grad is non-finite",
    StopReason.GRADIENT_BEFORE_STEP: "a gradient is non-finite before the optimizer step",
    StopReason.PARAMETER_BEFORE_STEP: "a parameter is non-finite before the optimizer step",
    StopReason.READ_BACK: "the script read a non-finite value back (.item(), .tolist(), .numpy() or print)",
    StopReason.SCRIPT_RAISED: "the script checked this value itself and raised an error over it",
    StopReason.OP_REFUSED: "the op it went into raised an error over it",
    StopReason.NAN_HIDDEN: "an op turned the NaN into finite values that no longer show it (see the note): what "
                           "follows computes with them",
    StopReason.OPTIMIZER_SETTING: "the optimizer's learning rate (or another setting of a param group) is "
                                  "non-finite before its step: every update it makes is NaN",
    StopReason.MONITORED_METRIC: "training follows it (ReduceLROnPlateau, EarlyStopping): a NaN metric never "
                                 "improves, so the learning rate drops or training ends over it",
    StopReason.AMP_SCALE_COLLAPSE: "the GradScaler skipped a step at a loss scale of 1 or less: the gradients are non-finite unscaled",
}


def stop_reason(reason: StopReason, event: Site) -> str:
    """Why the run stopped at the event, in a phrase."""
    facts = event.facts
    if reason is StopReason.GRADIENT_AFTER_BACKWARD:
        named = facts.parameter is not None and facts.parameter.name
        return f"the gradient of `{facts.parameter.name}` is non-finite after backward()" if named else \
            "a gradient is non-finite after backward()"
    if reason is StopReason.UPDATE:
        return f"optimizer.step() ({facts.optimizer}) made a parameter non-finite"
    if reason is StopReason.STATE_EXPORTED:
        return f"a module's state_dict() holds a non-finite value in {parameter_phrase(facts.parameter)}"
    if reason is StopReason.PARAMETER_WRITTEN:
        return f"a non-finite value was written into {parameter_phrase(facts.parameter)}"
    return _STOP_REASONS[reason]


def ctc_items(items: tuple[CtcItem, ...], listed: int = 5) -> str:
    """`item 3 (4 frames for 7 labels), item 5 (5 frames for 4 labels + 1 repeat)`: the batch
    items CTC cannot align, with what each needs; the first `listed`, then a count."""
    said = [f"item {i.item} ({plural(i.input_length, 'frame')} for {plural(i.target_length, 'label')}"
            + (f" + {plural(i.repeats, 'repeat')}" if i.repeats else "") + ")" for i in items[:listed]]
    if len(items) > listed:
        said.append(f"and {len(items) - listed} more")
    return ", ".join(said)


def site_brief(site: Site) -> str:
    """`aten.div.Tensor at model.py:12`."""
    return f"{site.op} at {site.location}" if site.location else site.op


_NOTED = 10  # sites a note lists beyond the summary's


def discarded_notes(discarded: list[Discarded], listed: int = DISCARDED_LISTED) -> list[str]:
    """For a clean run: the places that made non-finite values beyond the `listed` ones the
    clean summary names (`report.text.discarded_summary`), each with its op, kind and count,
    most frequent first; nothing when the summary names them all."""
    notes = []
    for allowed, head in ((False, "made and discarded"), (True, "made on lines you allowed")):
        group = [d for d in discarded if d.allowed == allowed]
        if len(group) <= listed:
            continue
        rest = group[listed:]
        sites = "; ".join(_discarded_site(d) for d in rest[:_NOTED])
        more = f"; and {plural(len(rest) - _NOTED, 'more place')}" if len(rest) > _NOTED else ""
        notes.append(f"non-finite values were also {head}: {sites}{more}.")
    return notes


def _discarded_site(d: Discarded) -> str:
    where = f" at {d.location}" if d.location else ""
    return f"{d.op or 'a value entering torch'}{where} ({'NaN' if d.made == 'nan' else 'Inf'}, {times(d.count)})"


def hidden(op: str | None) -> str:
    """What an op that turned a NaN into finite values made of it."""
    name = (op or "an op").removeprefix("aten.")
    how = {"_to_copy": "a cast to an integer type turns NaN into an arbitrary integer (-9223372036854775808 for "
                       "int64: a class label that indexes out of range, a count of garbage)",
           "grid_sampler_2d": "a sampling grid's NaN coordinates are clipped to the border (or read as zeros): the "
                              "output looks fine, and backward through it is undefined (it can crash)",
           "grid_sampler_3d": "a sampling grid's NaN coordinates are clipped to the border (or read as zeros)"}.get(
        name, "its output is finite where its input was NaN")
    return f"`{name}` took the NaN above and made finite values of it: {how}."


def refused(op: str | None, error: BaseException) -> str:
    message = next(iter(error_message(error).strip().splitlines()), "")
    return (f"`{op or 'an op'}` raised {type(error).__name__}" + (f" ({message})" if message else "")
            + " over this value: a NaN fails every range check (an Inf every bound), so the error comes from the "
            "non-finite value. Plain python dies of the same error without saying where the value came from.")


def raised_over(error: BaseException) -> str:
    if isinstance(error, SystemExit):
        return f"the script stopped itself: it exited with status {error.code!r} over this value."
    message = error_message(error).strip()
    return (f"the script stopped itself: it raised {type(error).__name__}"
            + (f" ({message})" if message else "") + " over this value.")
