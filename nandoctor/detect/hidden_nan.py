"""Integers a cast made of NaN, followed to where they are used or left out.

A cast to an integer type turns NaN into an arbitrary integer (-2**63 for int64 on x86, 0
on ARM): a class label that indexes out of range, a count of garbage. What follows
computes with values that no longer show the NaN, so the cast is where a run that uses
them must stop. But semi-supervised scripts keep "no label" as NaN in a float label
vector, cast it (`target = y.long()`) and leave the unlabelled rows out with the mask they
took before (`target[~torch.isnan(y)]`): those integers are never used.

So the cast's output is not a stop by itself. Its positions that were NaN are kept beside
it (a boolean tensor of its shape), and each op that takes it:
- a view, copy or selection of it (an op that only passes values on, `target[mask]`,
  `target[:8]`, `.clone()`): the same op applied to the positions says which positions
  of the output came from NaN; an output with none is clean, one with some is followed on;
- any other op (a loss, an embedding lookup, arithmetic, an index into another tensor):
  uses the integers, and stops the run if any came from NaN.
Entries live as long as the integer tensor (a weak reference).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from nandoctor.detect.records import Record


@dataclass(frozen=True)
class HiddenNaN:
    tensor: weakref.ref  # the integer tensor
    positions: torch.Tensor  # bool, its shape: which elements the cast made of NaN
    record: Record  # the NaN's record
    hidden_by: str  # the cast, "aten._to_copy"


def hide(table: dict[int, HiddenNaN], out: torch.Tensor, positions: torch.Tensor, record: Record,
         hidden_by: str) -> None:
    """`out` holds at `positions` what a cast made of the NaN `record` stands for. Kept only
    when some position did: so every entry holds one, and any use of it is a use of NaN."""
    if not bool(positions.any()):
        return
    key = id(out)
    table[key] = HiddenNaN(weakref.ref(out, lambda _: table.pop(key, None)), positions, record, hidden_by)


def taken_by(table: dict[int, HiddenNaN], args) -> list[tuple[int, HiddenNaN]]:
    """The entries of the tensors in `args` (lists of tensors included), with their index
    in `args` (-1 for one inside a list)."""
    found = []
    for index, a in enumerate(args):
        items = [(index, a)] if isinstance(a, torch.Tensor) else [(-1, t) for t in a] \
            if isinstance(a, (list, tuple)) else ()
        for i, t in items:
            entry = table.get(id(t)) if isinstance(t, torch.Tensor) else None
            if entry is not None and entry.tensor() is t:
                found.append((i, entry))
    return found


def positions_passed_on(func, args, kwargs, out) -> torch.Tensor | None:
    """For an op that only passes values on, taking the integers as its first argument:
    the positions of `out` that came from NaN (the op applied to the positions instead);
    None where it cannot tell (the op does not apply to a boolean tensor)."""
    if not isinstance(out, torch.Tensor):
        return None
    try:
        positions = func(*args, **kwargs)
    except (RuntimeError, TypeError, ValueError, IndexError):
        return None
    if not isinstance(positions, torch.Tensor) or positions.shape != out.shape:
        return None
    return positions if positions.dtype == torch.bool else positions != 0
