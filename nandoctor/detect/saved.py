"""Non-finite values that go through `torch.save` and come back with `torch.load` keep
their record, so a NaN made while preparing a cache is still traced to the op that made it
(the loaded tensor is new memory: the record table, keyed by storage, cannot see it).

At save, each tensor in the saved object whose record names the op that made it is remembered by a fingerprint of its
values; at load, a non-finite tensor with the same fingerprint gets the same record. Only
the rare path pays: saving looks only at tensors that have a record, loading only at
non-finite ones, and only while something saved is remembered.
"""
from __future__ import annotations

import torch

from nandoctor.detect.batches import tensors_in
from nandoctor.detect.mode import all_finite
from nandoctor.detect.records import Record, RecordTable

REMEMBERED = 256


def fingerprint(t: torch.Tensor) -> tuple:
    """Shape, dtype, and where and how the values are non-finite, plus the sum of the rest."""
    flat = t.detach().reshape(-1).double()
    bad = ~torch.isfinite(flat)
    return (tuple(t.shape), t.dtype, int(torch.isnan(flat).sum()), int(torch.isposinf(flat).sum()),
            int(bad.nonzero()[:8].sum()), float(torch.where(bad, 0.0, flat).sum()))


class SavedValues:
    def __init__(self, records: RecordTable) -> None:
        self.records = records
        self._by_fingerprint: dict[tuple, Record] = {}

    def saving(self, obj) -> None:
        if not self.records:
            return
        for _, t in tensors_in(obj):
            record = self.records.get(t)
            # A value that entered torch from outside is from outside again once it is read
            # back from a file (a checkpoint loaded into a model is the file's problem).
            if record is not None and (record.intended or not record.facts.entered) \
                    and len(self._by_fingerprint) < REMEMBERED:
                self._by_fingerprint[fingerprint(t)] = record

    def loaded(self, obj) -> None:
        if not self._by_fingerprint:
            return
        for _, t in tensors_in(obj):
            if t.is_floating_point() and not t.is_meta and not all_finite(t):
                record = self._by_fingerprint.get(fingerprint(t))
                if record is not None:
                    self.records.put(t, record)
