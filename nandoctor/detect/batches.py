"""Batches out of a DataLoader that arrive already non-finite (phase `data`).

Data loading runs without the per-op mode (collation is hundreds of small ops, and workers
run in other processes anyway). When a batch is bad, the bad samples of a map-style dataset
are fetched again in this process under the mode (`refetch`), so an op in `__getitem__`
that made the NaN (`mask / mask.max()`) is found with its own line; otherwise the batch
itself is reported, with its number, the bad rows and their dataset indices.
"""
from __future__ import annotations

from typing import Callable

import torch

from nandoctor.detect.boundaries import Stop
from nandoctor.detect.mode import all_finite
from nandoctor.detect.recorder import Recorder
from nandoctor.detect.result import BatchOrigin, StopReason

ROWS_KEPT = 20


class BatchChecks:
    def __init__(self, recorder: Recorder, stop: Stop, refetch: Callable[[object, tuple[int, ...]], None]) -> None:
        self.recorder = recorder
        self.stop = stop
        self.refetch = refetch  # fetch these samples again under the per-op mode

    def check(self, batch, batch_number: int, indices, dataset=None) -> None:
        for path, t in tensors_in(batch):
            if not all_finite(t):
                origin = batch_origin(t, path, batch_number, indices)
                if dataset is not None and origin.dataset_indices and hasattr(dataset, "__getitem__"):
                    self.refetch(dataset, origin.dataset_indices)  # stops the run if an op made it
                record = self.recorder.existing_or_bare(t, "", "data")
                record.facts.batch = origin
                self.stop(record, StopReason.BATCH)


def tensors_in(batch, path: str = ""):
    """(path, tensor) for every tensor in a nested batch: `[1]`, `['mask']`, `[0][2]`."""
    if isinstance(batch, torch.Tensor):
        yield path or "batch", batch
    elif isinstance(batch, dict):
        for k, v in batch.items():
            yield from tensors_in(v, f"{path}[{k!r}]")
    elif isinstance(batch, (list, tuple)):
        for i, v in enumerate(batch):
            yield from tensors_in(v, f"{path}[{i}]")


def batch_origin(t: torch.Tensor, path: str, batch_number: int, indices) -> BatchOrigin:
    bad_rows = (~torch.isfinite(t)).reshape(t.shape[0], -1).any(dim=1).nonzero().flatten().tolist() if t.dim() else []
    rows = tuple(bad_rows[:ROWS_KEPT])
    dataset_indices = None
    if indices is not None:
        try:
            dataset_indices = tuple(int(indices[i]) for i in rows)
        except (IndexError, TypeError, ValueError):
            pass
    return BatchOrigin(batch_number, path, rows, dataset_indices)
