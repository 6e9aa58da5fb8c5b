"""Words for the typed facts detection hands over: why it stopped, which parameter, where
an intended Inf was written. Used by the rules and by the report's stop reason."""
from __future__ import annotations

from nandoctor.detect.result import Discarded, ParameterRef, Site, SiteFacts, StopReason


def parameter(ref: ParameterRef | None) -> str:
    """`encoder.0.weight`, `param_groups[0].params[1] (3,)` or `a parameter of shape (3,)`."""
    if ref is None:
        return "a parameter"
    if ref.name:
        return ref.name
    if ref.group is not None:
        return f"param_groups[{ref.group}].params[{ref.index}] {ref.shape}"
    return f"a parameter of shape {ref.shape}"


def parameter_phrase(ref: ParameterRef | None) -> str:
    """`parameter `encoder.0.weight`` when it has a name, else the description alone."""
    return f"parameter `{ref.name}`" if ref is not None and ref.name else parameter(ref)


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
    if reason is StopReason.PARAMETER_WRITTEN:
        return f"a non-finite value was written into {parameter_phrase(facts.parameter)}"
    return _STOP_REASONS[reason]


def site_brief(site: Site) -> str:
    """`aten.div.Tensor at model.py:12`."""
    return f"{site.op} at {site.location}" if site.location else site.op


def discarded_notes(discarded: list[Discarded], listed: int = 5) -> list[str]:
    """For a clean run: the non-finite values that were made and never mattered, and the
    ones the user allowed, each by where they were born, most frequent first."""
    notes = []
    for allowed, head in ((False, "made and discarded (none reached the loss, a gradient, a parameter or a "
                                  "value the script read)"),
                          (True, "made on lines you allowed (`# nandoctor: allow` or run.allow)")):
        group = [d for d in discarded if d.allowed == allowed]
        if not group:
            continue
        total = sum(d.count for d in group)
        sites = "; ".join(_discarded_site(d) for d in group[:listed])
        more = f"; and {len(group) - listed} more places" if len(group) > listed else ""
        notes.append(f"{total} non-finite value{'s were' if total != 1 else ' was'} {head}: {sites}{more}.")
    return notes


def _discarded_site(d: Discarded) -> str:
    where = f" at {d.location}" if d.location else ""
    return f"{d.op or 'a value entering torch'}{where} ({'NaN' if d.made == 'nan' else 'Inf'} ×{d.count})"
