"""The table of diagnosis rules, registered like PyTorch's `register_flop_formula`.

Three kinds of rules, tried in this order:
1. `context` rules: facts about the run that outrank the op (a batch that arrived
   non-finite, a leaking masked Inf, a bad parameter, the optimizer's own update).
2. `op` rules, by the root op's base name (`log`, `div`, ...) for forward roots, and by the
   forward op a backward node differentiates (`SqrtBackward0` -> `sqrt`) for backward roots.
3. `fallback` rules: history (exploding gradients), dtype (float16 overflow), Inf arithmetic.
A rule returns a `Cause` or None (does not apply). Registering one name twice is an error.
"""
from __future__ import annotations

from typing import Callable, Optional

from nandoctor.diagnose.evidence import Evidence
from nandoctor.report.model import Cause

Rule = Callable[[Evidence], Optional[Cause]]

_op_rules: dict[str, Rule] = {}
_context_rules: list[Rule] = []
_fallback_rules: list[Rule] = []


def op_rule(*op_names: str):
    def register(rule: Rule) -> Rule:
        for name in op_names:
            if name in _op_rules:
                raise ValueError(f"a diagnosis rule for '{name}' is already registered")
            _op_rules[name] = rule
        return rule

    return register


def context_rule(rule: Rule) -> Rule:
    _context_rules.append(rule)
    return rule


def fallback_rule(rule: Rule) -> Rule:
    _fallback_rules.append(rule)
    return rule


def rule_for_op(name: str | None) -> Rule | None:
    return _op_rules.get(name) if name else None


def context_rules() -> list[Rule]:
    return list(_context_rules)


def fallback_rules() -> list[Rule]:
    return list(_fallback_rules)
