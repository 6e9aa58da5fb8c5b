"""torch.compile under nandoctor (detect/compiled.py): the user's graphs are the ones plain
python gets, and what compiled code makes is still found."""
from __future__ import annotations

import pytest
import torch

from helpers import detect

torch._dynamo = pytest.importorskip("torch._dynamo")
from torch._dynamo.utils import counters  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self, broken: bool = False):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)
        self.broken = broken

    def forward(self, x):
        h = torch.relu(self.a(x))
        if self.broken:
            h = torch.log(h * 0)  # -inf, then NaN in the next layer
        return self.b(h)


def _train(broken: bool = False, steps: int = 3):
    torch.manual_seed(0)
    model = Net(broken)
    compiled = torch.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for _ in range(steps):
        loss = ((compiled(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def _dynamo_counts(fn) -> tuple:
    torch._dynamo.reset()
    counters.clear()
    fn()
    return dict(counters["stats"]), dict(counters["frames"]), sum(counters["graph_break"].values())


def test_the_compiled_model_gets_the_same_frames_graphs_and_breaks_as_under_plain_python():
    plain = _dynamo_counts(_train)
    under_trace = _dynamo_counts(lambda: detect(_train))
    assert plain[0]["unique_graphs"] >= 1
    assert under_trace == plain


def test_parameters_end_bit_identical_to_plain_python():
    torch._dynamo.reset()
    plain = _train()
    torch._dynamo.reset()
    box = {}
    found = detect(lambda: box.setdefault("model", _train()))
    assert not found.stopped
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), box["model"].parameters()))


def test_a_nonfinite_output_of_compiled_code_is_named_and_sent_to_the_eager_replay():
    torch._dynamo.reset()
    found = detect(lambda: _train(broken=True))
    assert found.stopped
    root = found.detection.root
    assert root.facts.compiled == "Net"
    assert root.op == "" and not root.facts.untracked_input  # not mistaken for bad input data
    assert found.detection.needs_replay


def test_run_eagerly_as_the_replay_does_the_op_inside_the_compiled_code_is_found():
    torch._dynamo.reset()
    found = detect(lambda: _train(broken=True), eager_compiled=True)
    assert found.stopped
    root = found.detection.root
    assert root.op == "aten.log.default"
    assert root.location.function == "forward" and "torch.log(h * 0)" in root.location.code
