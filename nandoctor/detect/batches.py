"""Batches out of a DataLoader that arrive already non-finite (phase `data`).

Data loading runs without the per-op mode (collation is hundreds of small ops, and workers
run in other processes anyway). A bad batch is a suspect like any other non-finite value:
it gets a record (its number, the bad rows and their dataset indices) and stops the run
only if it reaches something that matters; a script that imputes it first runs on. The bad
samples of a map-style dataset are fetched again in this process under the mode
(`refetch`), so an op in `__getitem__` that made the NaN (`mask / mask.max()`) becomes the
batch's parent in the lineage, with its own line; a sample that is a slice of a tensor
already non-finite when it entered torch (`TensorDataset(torch.from_numpy(x))`) has that
entry as its parent, at the line where it came in. When no op there made it and the loader
collates with a function of the script's, the whole batch is fetched and collated again:
a per-batch statistic (`(y - y.mean()) / y.std()` over a constant batch) needs every sample.
When the samples come back finite and a worker process made the batch, a random transform
drew differently here (a random crop that only sometimes lands on an all-black patch): the
batch is fetched again as that worker fetched it, with its seeds, its `worker_init_fn` and
the batches it fetched before, in order (`refetch_as_worker`), so the crop is the same one.
The script's random state is put back after a refetch, and a refetch reads from a copy of
the dataset whose own generators are copies (`undisturbed`), so that the script's dataset
draws what it would have drawn: a run with a legitimate NaN in its batches trains on the
same numbers as under plain python.
"""
from __future__ import annotations

import copy
import dataclasses
import random
import sys
from typing import Callable

import torch

from nandoctor.detect.mode import all_finite
from nandoctor.detect.recorder import Recorder
from nandoctor.detect.records import next_order
from nandoctor.detect.result import BatchOrigin

ROWS_KEPT = 20


# A worker's batches fetched again, at most, to reproduce its random state for a later one.
WORKER_BATCHES_REPLAYED = 2000
# Bad batches a run fetches again as their worker did (each replays the worker's epoch so far).
WORKER_REFETCHES = 3


@dataclasses.dataclass(frozen=True)
class StreamPosition:
    """Where a batch came from, for fetching it again. A batch of an IterableDataset has no
    indices, only its place in a stream (a worker's own stream, with workers); one of a
    map-style dataset made by a worker needs the batches that worker fetched before it
    (`drawn`: every batch's indices this epoch, in order; None when not kept)."""

    batch_size: int | None  # samples a batch (None: the loader does not batch)
    workers: int  # 0: the stream is iterated in this process
    base_seed: int | None = None  # the loader's seed for this epoch's workers
    worker_init_fn: Callable | None = None
    drawn: list | None = None

    def worker_batches(self, batch_number: int) -> list | None:
        """The indices of each batch the worker that made `batch_number` fetched, in order,
        that one last; None when they are not known or too many to fetch again."""
        worker, number = self.worker_of(batch_number)
        if worker is None or self.drawn is None or batch_number >= len(self.drawn) \
                or number >= WORKER_BATCHES_REPLAYED:
            return None
        return self.drawn[worker:batch_number + 1:self.workers]

    def worker_of(self, batch_number: int) -> tuple[int | None, int]:
        """(the worker that made batch `batch_number`, or None; its number in that worker's
        stream): workers take the batches in turn."""
        if not self.workers:
            return None, batch_number
        return batch_number % self.workers, batch_number // self.workers


class BatchChecks:
    def __init__(self, recorder: Recorder, refetch: Callable[..., list], refetch_stream: Callable[..., list],
                 refetch_as_worker: Callable[..., list]) -> None:
        self.recorder = recorder
        # refetch(dataset, indices, collate=None): again, under the per-op mode; gives the
        # non-finite tensors of the refetched samples (None: the dataset failed on a re-read)
        self.refetch = refetch
        # refetch_stream(dataset, stream, batch_number, collate): an IterableDataset's batch
        # again, from a new pass over its stream; the same answer as `refetch`
        self.refetch_stream = refetch_stream
        # refetch_as_worker(dataset, stream, worker, batches, collate): a map-style batch a
        # worker made (the last of `batches`), fetched again after the ones it fetched
        # before; the same answer
        self.refetch_as_worker = refetch_as_worker
        self.worker_refetches = 0

    def check(self, batch, batch_number: int, indices, dataset=None, collate=None, stream=None) -> None:
        for path, t in tensors_in(batch):
            if not all_finite(t):
                origin = batch_origin(t, path, batch_number, indices)
                mark = next_order()
                refetchable = dataset is not None and hasattr(dataset, "__getitem__")
                fetched = None
                if refetchable and origin.dataset_indices:
                    fetched = self.refetch(dataset, origin.dataset_indices)
                elif stream is not None and isinstance(dataset, torch.utils.data.IterableDataset):
                    fetched = self.refetch_stream(dataset, stream, batch_number, collate if _own_collate(collate) else None)
                if refetchable and self.recorder.first_birth_since(mark) is None and _own_collate(collate) \
                        and indices is not None:
                    # Not made in __getitem__: a collate_fn of the script's may have made it, from
                    # the whole batch (a per-batch statistic): the batch is collated again.
                    self.refetch(dataset, tuple(int(i) for i in indices), collate)
                if refetchable and fetched == [] and self.recorder.first_birth_since(mark) is None:
                    fetched = self._as_its_worker(dataset, stream, batch_number, collate) or fetched
                made_here = self.recorder.first_birth_since(mark) or self._entered_earlier(fetched or [])
                if made_here is None and fetched == []:
                    origin = dataclasses.replace(origin, refetched_finite=True)
                record = self.recorder.existing_or_bare(t, "", "data")
                record.facts.batch = origin
                if made_here is not None:  # an op in __getitem__ made it: the batch's parent
                    record.parents.append(made_here)
                    record.facts.untracked_input = False
                    # The root is that op, and the report names the root's batch and samples.
                    made_here.facts.batch = made_here.facts.batch or origin
                self.recorder.records.put(t, record)

    def _as_its_worker(self, dataset, stream, batch_number: int, collate):
        """Fetched again here the batch came back finite: where a worker made it, fetch it
        again as that worker did (None when no worker did, or it cannot be)."""
        batches = stream.worker_batches(batch_number) if stream is not None else None
        if batches is None or self.worker_refetches >= WORKER_REFETCHES:
            return None
        self.worker_refetches += 1
        worker, _ = stream.worker_of(batch_number)
        return self.refetch_as_worker(dataset, stream, worker, batches, collate if _own_collate(collate) else None)

    def _entered_earlier(self, samples: list[torch.Tensor]):
        """The earliest record a bad sample carries from before this batch: the tensor the
        dataset slices entered torch non-finite (from_numpy, torch.tensor) or an op made it;
        else an Inf written on purpose that `__getitem__` passed on (`t[never] = inf` in
        `__init__`, then `log(t[i])`): a sentinel used as data."""
        carried = [r for r in map(self.recorder.records.get, samples) if r is not None]
        made = [r for r in carried if not r.intended]
        return min(made or carried, key=lambda r: r.order, default=None)


def undisturbed(dataset, depth: int = 0):
    """A copy of `dataset` to fetch samples from again, leaving the script's own as it was:
    shallow (the data is shared, not duplicated; a counter it bumps is the copy's), with
    copies of the random generators it keeps (`self.rng = np.random.default_rng(0)`) and
    such copies of the datasets it wraps (a Subset's, a ConcatDataset's). The dataset
    itself where it cannot be copied."""
    try:
        twin = copy.copy(dataset)
        attributes = vars(twin)
    except Exception:  # noqa: BLE001 - (no __dict__, or a copy the class refuses)
        return dataset
    if twin is dataset:
        return dataset
    for name, value in list(attributes.items()):
        if _a_generator(value):
            attributes[name] = _generator_copy(value)
        elif depth < 3 and isinstance(value, torch.utils.data.Dataset):
            attributes[name] = undisturbed(value, depth + 1)
        elif depth < 3 and isinstance(value, (list, tuple)) and value \
                and all(isinstance(v, torch.utils.data.Dataset) for v in value):
            attributes[name] = type(value)(undisturbed(v, depth + 1) for v in value)
    return twin


def _a_generator(value) -> bool:
    if isinstance(value, (random.Random, torch.Generator)):
        return True
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, (np.random.Generator, np.random.RandomState))


def _generator_copy(generator):
    if isinstance(generator, torch.Generator):
        twin = torch.Generator(device=generator.device)
        twin.set_state(generator.get_state())
        return twin
    return copy.deepcopy(generator)


def _own_collate(collate) -> bool:
    """A collate function that is not torch's own (which only stacks: it makes nothing)."""
    if collate is None:
        return False
    from torch.utils.data._utils import collate as torch_collate

    return collate not in (torch_collate.default_collate, torch_collate.default_convert)


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
