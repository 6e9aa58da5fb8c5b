"""The table of diagnosis rules, registered like PyTorch's `register_flop_formula`.

Three kinds of rules, tried in this order:
1. `context` rules: facts about the run that outrank the op (a batch that arrived
   non-finite, a leaking masked Inf, a bad parameter, the optimizer's own update).
2. `op` rules: for a forward root by the root op's base name (`log`, `div`, ...); for a
   backward root by its autograd node's name without the overload digit
   (`SqrtBackward0` -> `SqrtBackward`), given to `op_rule(..., nodes=...)`.
3. `fallback` rules: history (exploding gradients), dtype (float16 overflow), Inf arithmetic.
A rule returns a `Cause` or None (does not apply). Registering one name twice is an error.
"""
from __future__ import annotations

from typing import Callable, Iterable, Optional

from nandoctor.diagnose.evidence import Evidence
from nandoctor.report.model import Cause

Rule = Callable[[Evidence], Optional[Cause]]

_op_rules: dict[str, Rule] = {}
_node_rules: dict[str, Rule] = {}
_formula_rules: dict[str, Rule] = {}
_context_rules: list[Rule] = []
_fallback_rules: list[Rule] = []


def op_rule(*op_names: str, nodes: Iterable[str] = (), in_formulas: bool = False):
    """Register a rule for forward ops by base name and backward nodes by name. With
    `in_formulas`, the rule also judges its ops where a backward formula with no rule of
    its own calls them (entr's gradient is -(log(p) + 1): a log of 0 there is log's case)."""

    def register(rule: Rule) -> Rule:
        for table, names in ((_op_rules, op_names), (_node_rules, nodes),
                             (_formula_rules, op_names if in_formulas else ())):
            for name in names:
                if name in table:
                    raise ValueError(f"a diagnosis rule for '{name}' is already registered")
                table[name] = rule
        return rule

    return register


def context_rule(rule: Rule) -> Rule:
    _context_rules.append(rule)
    return rule


def fallback_rule(rule: Rule) -> Rule:
    _fallback_rules.append(rule)
    return rule


def rule_for(ev: Evidence) -> Rule | None:
    if ev.node:
        rule = _node_rules.get(ev.node.rstrip("0123456789"))
        return rule if rule is not None else _formula_rules.get(ev.op)
    return _op_rules.get(ev.op) if ev.op else None  # a forward op, or one the user's backward code called


def context_rules() -> list[Rule]:
    return list(_context_rules)


def fallback_rules() -> list[Rule]:
    return list(_fallback_rules)
