"""Diagnosis: name the cause of a detection and the fix.

`diagnose(report)` asks the rules registered in `registry` (context rules, then the rule
of the root op's family, then the fallbacks) and returns the first cause that applies, or
`unknown` with the facts that were checked.
"""
from __future__ import annotations

from nandoctor.diagnose import rules as _rules  # noqa: F401  (registers every rule)
from nandoctor.diagnose.evidence import Evidence
from nandoctor.diagnose.registry import context_rules, fallback_rules, rule_for_op
from nandoctor.report.model import Cause, RunReport


def diagnose(report: RunReport) -> Cause:
    evidence = Evidence.from_report(report)
    for rule in candidate_rules(evidence):
        cause = rule(evidence)
        if cause is not None:
            return cause
    return unknown(evidence)


def candidate_rules(ev: Evidence):
    yield from context_rules()
    op_rule = rule_for_op(ev.forward_op if ev.node else ev.op)
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
