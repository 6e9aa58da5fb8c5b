"""The step's boundary reads the gradients it will apply: dense or sparse."""
from __future__ import annotations

import pytest
import torch

from helpers import detect, line_in, watch
from nandoctor.detect.result import StopReason


def _sparse_embedding_training(bad_step: int | None, steps: int = 3):
    """An `Embedding(sparse=True)` trained with SGD: its weight's gradient is a sparse
    tensor, which has no `isfinite` and no norm kernel. At `bad_step` a hook scales the
    rows' gradient by Inf (a value made in backward, not in forward)."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4, sparse=True)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)

    def train():
        for step in range(steps):
            rows = emb(torch.tensor([1, 2, 2]))
            if step == bad_step:
                rows.register_hook(lambda g: g * float("inf"))  # MARK-hook
            opt.zero_grad()
            rows.pow(2).sum().backward()
            opt.step()

    return emb, train


def test_a_sparse_gradient_is_read_at_the_step_as_torch_trains_it():
    emb, train = _sparse_embedding_training(bad_step=None)
    result = detect(train)
    plain, plain_train = _sparse_embedding_training(bad_step=None)
    plain_train()
    assert not result.stopped and torch.equal(emb.weight, plain.weight)


def test_near_miss_a_sparse_gradient_made_non_finite_stops_before_its_step():
    _, train = _sparse_embedding_training(bad_step=1)
    result = detect(train)
    assert result.stopped and result.detection.reason is StopReason.GRADIENT_BEFORE_STEP
    root = result.detection.root  # the hook's op: its record passes on through the sparse gradient
    assert (root.op, root.phase, root.location.line) == ("aten.mul.Tensor", "backward", line_in(__file__, "MARK-hook"))
    assert result.detector.state.step == 1  # (the first step applied, the second not)


@pytest.mark.parametrize("bad_step, what", [(None, None), (1, "gradient")])
def test_watch_reads_a_sparse_gradients_norm(bad_step, what):
    _, train = _sparse_embedding_training(bad_step=bad_step)
    finding = watch(train, watch_gradients=True).finding()
    assert (finding.what if finding else None) == what
