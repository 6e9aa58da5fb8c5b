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


def _crf_with_forbidden_transitions(written: str, optimizer: str = "adam"):
    """A linear-chain CRF's transition matrix with one forbidden transition written as -inf
    into the Parameter: `written` "at_build" in `__init__` under no_grad, as CRF taggers do,
    or "while_training" (the same write into a trained model's weights). logsumexp gives
    the -inf entry a gradient of exactly 0: Adam leaves it at -inf; SGD's weight decay
    turns it into -inf - (-inf) = NaN."""
    torch.manual_seed(0)

    class CRF(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.trans = torch.nn.Parameter(0.01 * torch.randn(3, 3))
            if written == "at_build":
                with torch.no_grad():
                    self.trans[0, 2] = float("-inf")  # MARK-forbidden

        def forward(self, scores):
            return torch.logsumexp(scores[:, :, None] + self.trans[None], dim=(1, 2)).mean()

    built = []

    def train():  # (the model is built under nandoctor, as in a script)
        crf = CRF()
        built.append(crf)
        opt = (torch.optim.Adam(crf.parameters(), lr=0.05) if optimizer == "adam"
               else torch.optim.SGD(crf.parameters(), lr=0.05, weight_decay=1e-2))
        for step in range(4):
            if written == "while_training" and step == 2:
                with torch.no_grad():
                    crf.trans[0, 2] = float("-inf")  # MARK-late
            opt.zero_grad()
            crf(torch.randn(5, 3)).backward()
            opt.step()

    return built, train


def test_infinities_a_parameter_was_built_with_are_constants_of_the_model():
    built, train = _crf_with_forbidden_transitions("at_build")
    result = detect(train)
    assert not result.stopped and built[0].trans[0, 2].item() == float("-inf")


def test_near_miss_the_same_infinity_written_into_weights_in_training_stops_there():
    _, train = _crf_with_forbidden_transitions("while_training")
    result = detect(train)
    assert result.stopped and result.detection.root.location.line == line_in(__file__, "MARK-late")


def test_near_miss_a_constant_the_optimizers_weight_decay_turns_to_nan_stops_the_step():
    built, train = _crf_with_forbidden_transitions("at_build", optimizer="sgd")
    result = detect(train)
    assert result.stopped and result.detection.reason is StopReason.UPDATE
    assert torch.isnan(built[0].trans).any()
