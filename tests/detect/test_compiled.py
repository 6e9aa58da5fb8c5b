"""torch.compile under nandoctor (detect/compiled.py): the user's graphs are the ones plain
python gets, and what compiled code makes is still found."""
from __future__ import annotations

import re

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


def _train(broken: bool = False, steps: int = 3, **compile_args):
    torch.manual_seed(0)
    model = Net(broken)
    compiled = torch.compile(model, backend="aot_eager", **compile_args)
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


# Dynamo's two ways to tell that a dispatch mode is on: torch's mode stack (torch 2.13's
# default) or TorchDispatchMode's own flags (torch 2.9 and older, and 2.13 with
# `inline_torch_dispatch_torch_compile` off). A compiled call must find no mode either way.
_MODE_CHECKS = [True, False] if hasattr(torch._dynamo.config, "inline_torch_dispatch_torch_compile") else [None]


@pytest.mark.parametrize("mode_stack_check", _MODE_CHECKS, ids=lambda v: {True: "stack", False: "flags"}.get(v, "flags"))
def test_the_compiled_model_gets_the_same_frames_graphs_and_breaks_as_under_plain_python(mode_stack_check):
    settings = {} if mode_stack_check is None else {"inline_torch_dispatch_torch_compile": mode_stack_check}
    with torch._dynamo.config.patch(**settings):
        plain = _dynamo_counts(_train)
        under_trace = _dynamo_counts(lambda: detect(_train))
    assert plain[0]["unique_graphs"] >= 1
    assert under_trace == plain


@pytest.mark.parametrize("mode_stack_check", _MODE_CHECKS, ids=lambda v: {True: "stack", False: "flags"}.get(v, "flags"))
def test_compiled_code_called_in_a_phase_without_the_mode_compiles_and_the_phase_goes_on(mode_stack_check):
    # Data loading runs with the per-op mode off torch's stack: a compiled transform in
    # __getitem__ must still compile, and loading and training go on as before.
    class Doubled(torch.utils.data.Dataset):
        def __init__(self):
            self.scale = torch.compile(lambda x: x * 2 + 1, backend="aot_eager")  # (as a script would, under nandoctor)

        def __len__(self):
            return 8

        def __getitem__(self, i):
            return self.scale(torch.full((4,), float(i)))

    def train():
        w = torch.nn.Parameter(torch.ones(4))
        for batch in torch.utils.data.DataLoader(Doubled(), batch_size=4):
            torch.log(batch * w).sum().backward()
        torch.log(torch.tensor([-1.0])).sum().backward()  # the mode is back on after the loader

    settings = {} if mode_stack_check is None else {"inline_torch_dispatch_torch_compile": mode_stack_check}
    with torch._dynamo.config.patch(**settings):
        torch._dynamo.reset()
        counters.clear()
        found = detect(train)
    assert counters["stats"]["unique_graphs"] >= 1
    assert found.stopped and found.detection.root.op == "aten.log.default"
    assert torch._C._len_torch_dispatch_stack() == 0


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


@pytest.mark.parametrize("compile_args", [{}, {"fullgraph": True}], ids=["default", "fullgraph"])
def test_run_eagerly_as_the_replay_does_the_op_inside_the_compiled_code_is_found(compile_args):
    # (The replay runs the model's own code, not Dynamo under the mode: with fullgraph=True
    # Dynamo refuses to run a frame it cannot compile.)
    torch._dynamo.reset()
    found = detect(lambda: _train(broken=True, **compile_args), eager_compiled=True)
    assert found.stopped
    root = found.detection.root
    assert root.op == "aten.log.default"
    assert root.location.function == "forward" and "torch.log(h * 0)" in root.location.code
    # Named as the user's model names them: torch.compile's wrapper attribute is left out.
    assert root.module == "Net"
    assert [s.module for s in found.detection.lineage if s.op == "aten.addmm.default"] == ["b"]


def _export_and_trace() -> tuple[str, str]:
    torch.manual_seed(0)
    model, x = Net(), torch.randn(4, 8)
    exported = torch.export.export(model, (x,))
    traced = torch.jit.trace(model, x)
    assert torch.equal(exported.module()(x), model(x)) and torch.equal(traced(x), model(x))
    # (A class traced again gets a mangled TorchScript name: the names are not the program.)
    return str(exported.graph), re.sub(r"___torch_mangle_\d+\.", "", str(traced.inlined_graph))


def test_torch_export_and_jit_trace_record_the_same_programs_as_under_plain_python():
    # Both run the model once to record it, export on tensors without values. A check's
    # read of one added a symbol to export's trace, which then failed
    # (PendingUnbackedSymbolNotFound); under jit.trace the checks' own ops were recorded
    # and warned (TracerWarning). Neither is checked now, and the programs are python's.
    import warnings

    plain = _export_and_trace()
    under, recorded = [], []

    def run():
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            under.append(_export_and_trace())
        recorded.extend(w for w in seen if issubclass(w.category, torch.jit.TracerWarning))

    assert not detect(run).stopped
    assert under == [plain] and recorded == []
