"""Batches fetched again: from a copy of the dataset that leaves the script's own as it was."""
from __future__ import annotations

import random

import numpy as np
import torch
from torch.utils.data import ConcatDataset, Dataset, Subset

from nandoctor.detect.batches import undisturbed


class Drawing(Dataset):
    """A dataset keeping a generator of each kind and a counter."""

    def __init__(self) -> None:
        self.data = torch.arange(8.0)
        self.np_rng, self.legacy = np.random.default_rng(0), np.random.RandomState(0)
        self.py_rng, self.gen = random.Random(0), torch.Generator().manual_seed(0)
        self.served = 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i):
        self.served += 1
        draws = (self.np_rng.random(), self.legacy.rand(), self.py_rng.random(), float(torch.rand(1, generator=self.gen)))
        return self.data[i], draws


def test_a_copy_draws_what_the_dataset_would_have_drawn_and_leaves_it_as_it_was():
    dataset, reference = Drawing(), Drawing()
    _, drawn_by_the_copy = undisturbed(dataset)[3]
    assert dataset.served == 0
    assert dataset[3][1] == reference[3][1] == drawn_by_the_copy
    assert undisturbed(dataset).data is dataset.data  # the data is shared, not duplicated


def test_datasets_it_wraps_are_copied_the_same_way():
    inner, other = Drawing(), Drawing()
    for wrapped in (Subset(inner, [1, 2]), ConcatDataset([inner, other])):
        undisturbed(wrapped)[1]
    assert (inner.served, other.served) == (0, 0)
    assert inner[2][1] == Drawing()[2][1]


def test_near_miss_a_dataset_that_refuses_to_be_copied_is_fetched_from_itself():
    class Unpicklable(Dataset):  # (an open database handle, say)
        def __reduce_ex__(self, protocol):
            raise TypeError("cannot pickle 'Connection' object")

        def __getitem__(self, i):
            return float(i)

    dataset = Unpicklable()
    assert undisturbed(dataset) is dataset
