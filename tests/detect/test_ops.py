"""Op classification (detect/ops.py): which non-finite values an op writes on purpose."""
from __future__ import annotations

import torch

from helpers import detect, read_back


def test_a_minus_inf_scalar_tensor_written_by_a_mask_is_intended():
    def attention():
        scores = torch.randn(4, 4)
        mask = torch.ones(4, 4, dtype=torch.bool).triu(1)
        weights = torch.softmax(torch.where(mask, torch.tensor(float("-inf")), scores), dim=-1)
        read_back(weights)

    assert not detect(attention).stopped


def test_a_zero_d_tensor_an_op_made_non_finite_is_carried_through_where_not_written_on_purpose():
    # Keras's divide_no_nan: where(divisor == 0, 0, loss / divisor) over a loss that is inf.
    def loss_reduction():
        total = torch.tensor([1.0, 2.0]).sum() / torch.tensor(0.0)
        divisor = torch.tensor(64.0)
        mean = torch.where(divisor == 0, torch.tensor(0.0), total / divisor)
        read_back(mean)

    found = detect(loss_reduction)
    assert found.stopped
    assert found.detection.root.op == "aten.div.Tensor"
    assert not found.detection.root.facts.inf_written_at
