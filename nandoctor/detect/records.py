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
    # An Inf made in a dtype of `run.stop_on_inf_dtypes` (float16): an overflow, which stops
    # the run where it is absorbed into finite values unhandled (see Detector.absorbed).
    overflow: bool = False
    # The script tested the value for finiteness (`torch.isfinite(loss)`): it knows of it.
    tested: bool = False
    facts: SiteFacts = field(default_factory=SiteFacts)
    order: int = field(default_factory=next_order)


def lineage_of(record: Record, follows=lambda parent: True, limit: int = 256):
    """`record`, then the records it descends from through the parents `follows` accepts,
    each once, at most `limit` of them (an unrolled loop's lineage is long)."""
    stack, seen = [record], set()
    while stack and len(seen) < limit:
        r = stack.pop()
        if id(r) in seen:
            continue
        seen.add(id(r))
        yield r
        stack.extend(p for p in r.parents if follows(p))


def storage_key(t: torch.Tensor) -> int | None:
    try:
        return held_in(t).untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # nested, meta tensors
        return None


def held_in(t: torch.Tensor) -> torch.Tensor:
    """The dense tensor whose storage holds `t`'s values: itself, or a sparse tensor's
    values (an `Embedding(sparse=True)`'s gradient is a sparse COO tensor)."""
    if t.layout is torch.strided:
        return t
    return t._values() if t.layout is torch.sparse_coo else t.values()


def stored_values(t: torch.Tensor) -> torch.Tensor:
    """The values a check or a summary reads: a dense tensor itself; a sparse one's stored
    values, coalesced as the tensor holds them (duplicate indices summed), since `isfinite`
    and the norms have no sparse kernels."""
    if t.layout is torch.strided:
        return t
    return held_in(t.coalesce() if t.layout is torch.sparse_coo else t)


def tensors_of(args):
    """The tensors among `args`, lists of tensors (cat, stack) included."""
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (t for t in a if isinstance(t, torch.Tensor))


class RecordTable:
    """Storage -> the records of the non-finite values written there, by region.

    Mostly one record per storage. Views of one tensor written separately (`train_X[:, j]
    /= sd` and `val_X[:, j] /= sd`, two slices of one dataset tensor; a buffer filled
    sample by sample) each keep their own record: a later write elsewhere in the storage
    does not replace the record of values it never touched. A region is the element span
    a view covers (conservative for strided views)."""

    def __init__(self, limit: int = 4096) -> None:
        # key -> [(storage, record, (start, end))], latest last
        self._by_storage: dict[int, list[tuple[StorageWeakRef, Record, tuple[int, int]]]] = {}
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
        region = _region(t)
        kept = []
        for entry in self._by_storage.get(key, ()):
            ref, old, (start, end) = entry
            if ref.expired() or region[0] <= start and end <= region[1]:
                continue  # gone, or every value it covered may have been written again
            if old is record:  # (a view of a recorded value: one entry covering both)
                region = (min(start, region[0]), max(end, region[1]))
                continue
            kept.append(entry)
        kept.append((StorageWeakRef(held_in(t).untyped_storage()), record, region))
        self._by_storage[key] = kept[-_PER_STORAGE:]

    def get(self, t: torch.Tensor) -> Record | None:
        """The latest record of a value written where `t` looks."""
        key = storage_key(t)
        entries = self._by_storage.get(key) if key else None
        if not entries:
            return None
        if entries[0][0].expired():
            del self._by_storage[key]
            return None
        if len(entries) == 1 and entries[0][2] is _WHOLE:  # (the usual case: no region to compare)
            return entries[0][1]
        return next(reversed(self._overlapping(entries, _region(t))), None)

    def all_of(self, t: torch.Tensor) -> list[Record]:
        """Every record of a value written where `t` looks, oldest first (the rare path)."""
        key = storage_key(t)
        entries = self._by_storage.get(key) if key else None
        if not entries or entries[0][0].expired():
            return []
        return self._overlapping(entries, _region(t))

    def any_of(self, args) -> bool:
        """Does any tensor in `args` (lists of tensors included) have a record?"""
        return any(self.get(t) is not None for t in tensors_of(args))

    def forget(self, t: torch.Tensor) -> None:
        """A tensor was overwritten in place with finite values (e.g. masked_fill_ of the Infs):
        the records of values inside what it covers are gone."""
        key = storage_key(t)
        if not key or key not in self._by_storage:
            return
        start, end = _region(t)
        kept = [e for e in self._by_storage[key] if not (start <= e[2][0] and e[2][1] <= end)]
        if kept:
            self._by_storage[key] = kept
        else:
            del self._by_storage[key]

    @staticmethod
    def _overlapping(entries, region: tuple[int, int]) -> list[Record]:
        start, end = region
        return [record for _, record, (s, e) in entries if s < end and start < e]

    def prune(self) -> None:
        """Drop the records of freed storage (called at step boundaries and when full)."""
        dead = [k for k, entries in self._by_storage.items() if entries[0][0].expired()]
        for k in dead:
            del self._by_storage[k]
        if len(self._by_storage) >= self._limit:  # still full of live tensors: drop the oldest
            for k in list(self._by_storage)[: self._limit // 2]:
                del self._by_storage[k]


_PER_STORAGE = 16  # separately written regions kept per storage (the latest)
_WHOLE = (0, 1 << 62)  # the region of a tensor that covers its whole storage


def _region(t: torch.Tensor) -> tuple[int, int]:
    """The span of storage elements `t` covers: [offset, past its last element), or
    `_WHOLE` when that is all of its storage."""
    t = held_in(t)
    start = t.storage_offset()
    if t.numel() == 0:
        return start, start
    end = start + 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))
    if start == 0 and end * t.element_size() == t.untyped_storage().nbytes():
        return _WHOLE
    return start, end
