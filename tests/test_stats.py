"""stats.py: exact one-line summaries of a tensor. A CPU tensor is summarised through numpy
(no dispatch per reduction); every other tensor through torch. Both give the same numbers."""
from __future__ import annotations

import pytest
import torch

from nandoctor.stats import summarize


class _ThroughTorch(torch.Tensor):
    """A tensor subclass: summarize takes the torch path for it (a device tensor does too)."""


NAN, INF = float("nan"), float("inf")
TENSORS = {
    "causal mask": torch.full((64, 64), -INF).triu(1),
    "every kind": torch.tensor([NAN, 1.0, -2.0, 0.0, INF, -INF, 3.5]),
    "float16": torch.tensor([[1.5, -65504.0], [INF, 0.0]], dtype=torch.float16),
    "bfloat16 with NaN": torch.arange(10, dtype=torch.bfloat16).masked_fill(torch.arange(10) > 6, NAN),
    "0-d NaN": torch.tensor(NAN),
    "all -inf": torch.full((2, 3), -INF),
    "float64": torch.tensor([1e300, -1e-300, 0.0], dtype=torch.float64),
}


@pytest.mark.parametrize("name", list(TENSORS))
def test_a_cpu_tensor_is_summarised_as_torch_would(name):
    t = TENSORS[name]
    assert summarize(t, "x") == summarize(t.as_subclass(_ThroughTorch), "x")


def test_the_summary_counts_each_kind_and_ranges_the_finite_values():
    s = summarize(TENSORS["every kind"], "out")
    assert (s.nan, s.posinf, s.neginf, s.zeros, s.negatives, s.numel) == (1, 1, 1, 1, 2, 7)
    assert (s.min, s.max) == (-2.0, 3.5)
    assert s.first_nonfinite == ((0,), (4,), (5,))


def test_a_tensor_with_no_finite_value_has_no_range():
    s = summarize(TENSORS["all -inf"])
    assert (s.min, s.max, s.neginf) == (None, None, 6)
