"""Diagnosis: every word of a report — the cause and its fix, the stop reason, the notes.

`build_report(...)` turns what an observer found (a typed `Detection`, or nothing) and how
the script ended into the `RunReport` that renderers read; the session, the pytest plugin
and the tests all build reports through it. `diagnose(evidence)` asks the rules registered
in `registry` (context rules, then the rule of the root op's family, then the fallbacks)
and returns the first cause that applies, or `unknown` with the facts that were checked.
"""
from __future__ import annotations

import dataclasses

from nandoctor.detect.result import AmpScaling, Detection, Discarded, History, StopReason
from nandoctor.diagnose import rules as _rules  # noqa: F401  (registers every rule)
from nandoctor.diagnose import words
from nandoctor.diagnose.evidence import Evidence
from nandoctor.diagnose.registry import context_rules, fallback_rules, rule_for
from nandoctor.errors import ExitCode, error_message
from nandoctor.report.model import Cause, RunReport


def build_report(script: str, *, exit_code: int, mode: str = "trace", detection: Detection | None = None,
                 error: BaseException | None = None, step: int | None = None,
                 history: History | None = None, stopped_by: str | None = None,
                 discarded: list[Discarded] = (), amp: AmpScaling | None = None) -> RunReport:
    """The report of one run: nonfinite when there is a detection, else script_error when
    the script raised, else clean (saying which non-finite values were made and discarded)."""
    history = history or History()
    common = dict(script=script, step=step, mode=mode, history=history, stopped_by=stopped_by,
                  discarded=list(discarded))
    if detection is not None:
        report = RunReport(status="nonfinite", exit_code=int(ExitCode.FOUND), event=detection.event, root=detection.root,
                           lineage=detection.lineage, reason=words.stop_reason(detection.reason, detection.event),
                           **common)
        report.cause = diagnose(Evidence.of(detection, history, step))
        _no_torch_op_where_numpy_made_it(report)
        if error is not None:  # (the script raised over the value: say what it raised)
            report.error = {"type": type(error).__name__, "message": error_message(error)}
            report.notes.append(words.refused(detection.refused_by, error) if detection.reason is StopReason.OP_REFUSED
                                else words.raised_over(error))
        if detection.reason is StopReason.NAN_HIDDEN:
            report.notes.append(words.hidden(detection.hidden_by))
        if detection.flagged_suspects:
            report.notes.append("device flags saw a non-finite value this step in: "
                                + "; ".join(words.site_brief(s) for s in detection.flagged_suspects))
        return report
    if error is not None:
        return RunReport(status="script_error", exit_code=exit_code,
                         error={"type": type(error).__name__, "message": error_message(error)}, **common)
    report = RunReport(status="clean", exit_code=exit_code, **common)
    report.notes += words.discarded_notes(report.discarded)
    if amp is not None and amp.skipped:
        report.notes.append(_amp_skips(amp))
    return report


def _no_torch_op_where_numpy_made_it(report: RunReport) -> None:
    """A value numpy made (`np.log(counts)`, then `torch.from_numpy`) is rooted at numpy's
    line, where no torch op ran: its op is the contract's empty string, not the
    `lift_fresh` that wrapped the array lines later (numpy's function is in the cause)."""
    for site in (report.root, report.event, *report.lineage):
        if site is not None and site.facts.made_by_numpy:
            site.op = ""


def _amp_skips(amp: AmpScaling) -> str:
    return (f"the GradScaler skipped {amp.skipped} of {amp.steps} steps: the scaled gradients overflowed "
            "float16 and it lowered the scale (its normal probing, mostly at the start; not a finding)")


def diagnose(ev: Evidence) -> Cause:
    failed = []
    for rule in candidate_rules(ev):
        try:
            cause = rule(ev)
        except Exception as exc:  # noqa: BLE001 - a bug in one rule must not cost the report its finding
            failed.append(f"`{rule.__name__}` raised {type(exc).__name__}: {error_message(exc)}")
            continue
        if cause is not None:
            return cause
    cause = unknown(ev)
    if failed:
        cause = dataclasses.replace(cause, explanation=cause.explanation + " Of nandoctor's own rules, "
                                    + "; ".join(failed) + " (a bug in nandoctor: please report it with this report).")
    return cause


def candidate_rules(ev: Evidence):
    yield from context_rules()
    op_rule = rule_for(ev)
    if op_rule is not None:
        yield op_rule
    yield from fallback_rules()


def unknown(ev: Evidence) -> Cause:
    checked = [
        f"root op `{ev.root.op or '(none)'}` in {ev.root.phase}"
        + (f" (backward of `{ev.forward_op}`)" if ev.node else ""),
        "inputs: " + ("; ".join(f"{s.name}: zeros={s.zeros} negatives={s.negatives} nonfinite={s.nonfinite}" for s in ev.root.inputs) or "none recorded"),
        f"history: {len([v for v in ev.history.loss if v is not None])} losses recorded, no geometric growth",
    ]
    return Cause(
        "unknown",
        "no known cause matched",
        "nandoctor checked: " + "; ".join(checked) + ".",
        "Look at the root op's inputs above; run with `--json` and open an issue with the report if this is a common pattern.",
    )
