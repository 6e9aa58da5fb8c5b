"""What the detector learnt about each non-finite tensor it saw being made.

A `Record` is written only on the slow path (an op produced a NaN or an Inf), so it can
afford exact statistics. Records are keyed by the tensor's storage, which views share:
a NaN that reaches an op through `x.view(...)[mask]` is still traced to where it was born.
Each key keeps a weak reference to the storage itself (not to the Python tensor object,
which the autograd engine creates and drops between backward ops), so a record is dropped
once its memory is freed rather than matched against a new tensor that reuses it.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from nandoctor.detect.result import SiteFacts
from nandoctor.stats import TensorSummary

_sequence = itertools.count()


def next_order() -> int:
    """A number later than every record made so far (records are ordered by birth)."""
    return next(_sequence)


@dataclass(eq=False)
class Record:
    op: str
    phase: str
    where: tuple | None  # (code, line) of the user frame
    module: str | None
    backward_node: str | None
    node_seq: int | None  # sequence number of the autograd node (backward ops), or of the
    # node a forward op created
    step: int | None
    output: TensorSummary | None  # None for an op checked by a device flag (values gone)
    inputs: list[TensorSummary]
    parents: list["Record"]  # records of the non-finite inputs
    has_nan: bool
    intended: bool = False  # a -inf written on purpose (mask fill): not a root of anything
    facts: SiteFacts = field(default_factory=SiteFacts)
    order: int = field(default_factory=next_order)


def storage_key(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # sparse, nested, meta tensors
        return None


def tensors_of(args):
    """The tensors among `args`, lists of tensors (cat, stack) included."""
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (t for t in a if isinstance(t, torch.Tensor))


class RecordTable:
    """Storage -> the latest record of a non-finite value written there."""

    def __init__(self, limit: int = 4096) -> None:
        self._by_storage: dict[int, tuple[StorageWeakRef, Record]] = {}
        self._limit = limit

    def __bool__(self) -> bool:
        return bool(self._by_storage)

    def __len__(self) -> int:
        return len(self._by_storage)

    def put(self, t: torch.Tensor, record: Record) -> None:
        key = storage_key(t)
        if not key:
            return
        if len(self._by_storage) >= self._limit:
            self.prune()
        self._by_storage[key] = (StorageWeakRef(t.untyped_storage()), record)

    def get(self, t: torch.Tensor) -> Record | None:
        key = storage_key(t)
        entry = self._by_storage.get(key) if key else None
        if entry is None:
            return None
        storage, record = entry
        if storage.expired():
            del self._by_storage[key]
            return None
        return record

    def any_of(self, args) -> bool:
        """Does any tensor in `args` (lists of tensors included) have a record?"""
        return any(self.get(t) is not None for t in tensors_of(args))

    def forget(self, t: torch.Tensor) -> None:
        """A tensor was overwritten in place with finite values (e.g. masked_fill_ of the Infs)."""
        key = storage_key(t)
        if key:
            self._by_storage.pop(key, None)

    def prune(self) -> None:
        """Drop the records of freed storage (called at step boundaries and when full)."""
        dead = [k for k, (storage, _) in self._by_storage.items() if storage.expired()]
        for k in dead:
            del self._by_storage[k]
        if len(self._by_storage) >= self._limit:  # still full of live tensors: drop the oldest
            for k in list(self._by_storage)[: self._limit // 2]:
                del self._by_storage[k]
