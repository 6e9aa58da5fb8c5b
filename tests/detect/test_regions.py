"""torch.nn's own modules run as regions (detect/regions.py): the per-op mode is off inside
them, their outputs are checked, and a non-finite output is replayed op by op.

Each broken scenario runs twice, with regions (the default) and op by op
(`module_regions=False`, what the replay runs), and the two detections must agree on
everything a report says: the reason, the root op, its phase, line and module, the values
that went in and out, and the lineage. The healthy twins must not stop either way.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import detect, ops_through_the_mode
from nandoctor.detect import regions
from nandoctor.detect.regions import draws_random, is_region


def _linear(weight, bias=None) -> nn.Linear:
    layer = nn.Linear(len(weight[0]), len(weight), bias=bias is not None)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight))
        if bias is not None:
            layer.bias.copy_(torch.tensor(bias))
    return layer


def _overflow_then_inf_minus_inf():
    model = nn.Sequential(_linear([[1e20, 1e20]]), nn.Tanh(), _linear([[1.0]]), _linear([[1.0], [1.0]]),
                          _linear([[1.0, -1.0]]))
    model[1] = nn.Identity()  # the overflowed +inf goes on to inf - inf
    model(torch.tensor([[1e20, 1e20]])).sum().backward()


def _attention_with_a_fully_masked_row():
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(8, 2, batch_first=True)
    mask = torch.zeros(4, 4)
    mask[2] = float("-inf")  # query 2 may look at nothing: its softmax is 0/0
    x = torch.randn(1, 4, 8)
    out, _ = attention(x, x, x, attn_mask=mask)
    out.sum().backward()


def _dropout_before_an_overflow():
    # Which rows overflow depends on the dropout mask: the replay must draw the same one.
    torch.manual_seed(3)
    model = nn.Sequential(nn.Dropout(0.5), _linear([[3e38, 3e38]]), _linear([[1.0], [-1.0]]), _linear([[1.0, 1.0]]))
    model(torch.full((8, 2), 0.75)).sum().backward()


def _an_infinite_gradient_inside_a_linear():
    # Finite forward (h is tiny), infinite backward: the gradient into h is 1e10 * 1e31 * 2.
    model = nn.Sequential(_linear([[1e-10, 0.0], [0.0, 1e-10]]), _linear([[1e31, 1e31], [1e31, 1e31]]))
    (model(torch.ones(3, 2)) * 1e10).sum().backward()


def _a_log_in_the_loss_after_a_region():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    torch.log(model(torch.randn(16, 4)) - 10).mean().backward()  # log of negatives, outside the region


def _a_suspect_input_through_a_region():
    # A NaN input (a missing value) through a Linear: the region's output is replayed and
    # its NaN gets the lineage back to where the value entered.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), nn.Sigmoid())
    x = torch.tensor([[1.0, float("nan"), 2.0], [0.5, 0.5, 0.5]])
    model(x).sum().backward()


def _a_transformer_with_a_causal_mask():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    mask = nn.Transformer.generate_square_subsequent_mask(6)
    for _ in range(2):
        encoder(torch.randn(2, 6, 16), mask=mask, is_causal=True).pow(2).mean().backward()


def _a_mask_passed_through_a_region():
    # The region's output is the -inf mask again (non-finite, on purpose): it is replayed,
    # the mask's record goes on to the output, and the softmax after it is the usual one.
    mask = torch.full((4, 4), float("-inf")).triu(1)
    flat = nn.Sequential(nn.Flatten(0), nn.Identity())(mask)
    scores = torch.randn(16, requires_grad=True)
    (scores + flat).reshape(4, 4).softmax(-1).sum().backward()


def _label_smoothing_over_a_masked_class():
    # F.cross_entropy, a function region: smoothing spreads weight over the class masked to
    # -inf, whose log-probability is -inf. The replay finds the op inside the C call.
    torch.manual_seed(0)
    logits = nn.Linear(4, 3)(torch.randn(5, 4)).masked_fill(torch.tensor([False, False, True]), float("-inf"))
    F.cross_entropy(logits, torch.tensor([0, 1, 0, 1, 0]), label_smoothing=0.1).backward()


BROKEN = [_overflow_then_inf_minus_inf, _attention_with_a_fully_masked_row, _dropout_before_an_overflow,
          _an_infinite_gradient_inside_a_linear, _a_log_in_the_loss_after_a_region, _a_suspect_input_through_a_region,
          _label_smoothing_over_a_masked_class]
HEALTHY = [_a_transformer_with_a_causal_mask, _a_mask_passed_through_a_region]


def _what_a_report_says(detected) -> tuple:
    d = detected.detection
    site = lambda s: (s.op, s.phase, s.module, s.backward_node, s.location.line if s.location else None,  # noqa: E731
                      s.output, s.inputs)  # the values too: a replay that drew other random numbers differs
    return d.reason, site(d.root), [site(s) for s in d.lineage]


@pytest.mark.parametrize("scenario", BROKEN, ids=lambda f: f.__name__.strip("_"))
def test_regions_find_what_op_by_op_finds(scenario):
    with_regions = detect(scenario)
    op_by_op = detect(scenario, module_regions=False)
    assert with_regions.stopped and op_by_op.stopped
    assert _what_a_report_says(with_regions) == _what_a_report_says(op_by_op)
    assert with_regions.detection.root.op and not with_regions.detection.needs_replay


@pytest.mark.parametrize("scenario", HEALTHY, ids=lambda f: f.__name__.strip("_"))
def test_healthy_twins_stop_neither_way(scenario):
    assert not detect(scenario).stopped
    assert not detect(scenario, module_regions=False).stopped


@pytest.mark.parametrize("regions, through_python", [(True, False), (False, True)])
def test_a_healthy_forward_of_torch_modules_runs_no_op_through_python(monkeypatch, regions, through_python):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.LayerNorm(8), nn.Dropout(0.1), nn.Linear(8, 1))
    x = torch.randn(16, 4)
    seen = ops_through_the_mode(monkeypatch)
    assert not detect(lambda: model(x), module_regions=regions).stopped
    assert bool(seen) is through_python


def test_a_replay_leaves_the_outputs_and_the_random_stream_as_plain_python_has_them():
    def run():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.5))
        x = torch.tensor([[1.0, float("nan"), 2.0], [0.5, 0.5, 0.5]])
        y = torch.nan_to_num(model(x))  # the NaN row is replayed, then imputed: no stop
        return y, torch.rand(4)

    plain = run()
    results = []
    assert not detect(lambda: results.append(run())).stopped
    assert all(torch.equal(a, b) for a, b in zip(results[0], plain))


def test_backward_nodes_built_in_a_region_keep_their_forward_line_and_module():
    found = detect(_an_infinite_gradient_inside_a_linear).detection
    assert found.root.phase == "backward" and found.root.module == "1"
    assert found.root.location.code == "(model(torch.ones(3, 2)) * 1e10).sum().backward()"


class _MyLinear(nn.Linear):
    pass


@pytest.mark.parametrize("module, expected", [
    (nn.Sequential(nn.Linear(2, 2), nn.ReLU(inplace=True), nn.Linear(2, 1)), True),
    (nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16), 2, enable_nested_tensor=False), True),
    (_MyLinear(2, 2), False),  # a user's class: its code is the user's, checked op by op
    (nn.Sequential(nn.Linear(2, 2), _MyLinear(2, 2)), False),
    (nn.BatchNorm1d(4), False),  # a replay would update the running statistics twice
    (nn.LeakyReLU(inplace=True), False),  # run again on its own output, it changes it
    (nn.Embedding(4, 2, max_norm=1.0), False),  # renormalises its weight in place
    (nn.Flatten(), False),  # only views: op by op they are not even summed
], ids=["builtin-sequential", "transformer", "subclass", "contains-subclass", "batchnorm", "inplace-leaky", "max-norm",
        "only-views"])
def test_which_modules_are_regions(module, expected):
    assert is_region(module) is expected


@pytest.mark.parametrize("module, expected", [
    (nn.Sequential(nn.Linear(2, 2), nn.GELU(), nn.LayerNorm(2)), False),
    (nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.0)), True),  # (a probability set later draws: kept anyway)
    (nn.TransformerEncoderLayer(8, 2, 16), True),
    (nn.MultiheadAttention(8, 2, dropout=0.1), True),
    (nn.MultiheadAttention(8, 2), False),
    (nn.LSTM(4, 4, num_layers=2, dropout=0.2), True),
    (nn.RReLU(), True),
], ids=["linear-gelu-norm", "dropout", "transformer-layer", "attention-dropout", "attention", "lstm-dropout", "rrelu"])
def test_a_region_keeps_the_random_state_only_where_its_modules_draw(module, expected):
    assert draws_random(module) is expected


def test_near_miss_a_region_that_draws_nothing_replays_without_the_random_state(monkeypatch):
    # The replay of a region with no dropout finds the op without setting the generator.
    set_state = []

    class Generator:  # torch's, with its set_state calls counted
        get_state = staticmethod(torch.default_generator.get_state)

        @staticmethod
        def set_state(state):
            set_state.append(state)
            torch.default_generator.set_state(state)

    monkeypatch.setattr(regions, "_cpu_generator", Generator)
    model = nn.Sequential(_linear([[3e38, 3e38]]), _linear([[1.0], [-1.0]]))
    result = detect(lambda: model(torch.ones(1, 2)).sum().item())
    assert result.stopped and result.detection.root.op == "aten.mm.default" and set_state == []


def _log_hook(module, args, out):
    torch.log(out - 100).sum().item()  # a NaN the hook reads back


@pytest.mark.parametrize("on_every_module", [False, True], ids=["its-own-hook", "a-hook-on-every-module"])
def test_a_hooked_module_is_checked_op_by_op_and_the_hook_at_its_line(on_every_module):
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    if on_every_module:
        handle = torch.nn.modules.module.register_module_forward_hook(_log_hook)
    else:
        handle = model[0].register_forward_hook(_log_hook)

    def train():
        model(torch.ones(1, 2)).sum().backward()

    try:
        found = detect(train).detection
    finally:
        handle.remove()
    assert found.root.op == "aten.log.default"
    assert found.root.location.code == "torch.log(out - 100).sum().item()  # a NaN the hook reads back"


def test_a_region_a_ctrl_c_left_open_puts_the_mode_back(monkeypatch):
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    real_relu = torch.nn.functional.relu

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    def train():
        monkeypatch.setattr(torch.nn.functional, "relu", interrupted)
        with pytest.raises(KeyboardInterrupt):
            model(torch.ones(1, 2))  # torch runs no module hook after a KeyboardInterrupt
        monkeypatch.setattr(torch.nn.functional, "relu", real_relu)
        model(torch.ones(1, 2)).sum().backward()  # the next boundary closes the region
        torch.log(torch.tensor([-1.0])).sum().backward()

    found = detect(train)
    assert found.stopped and found.detection.root.op == "aten.log.default"
    assert torch._C._len_torch_dispatch_stack() == 0


def test_an_interrupted_region_leaves_the_mode_stack_clean_at_the_end(monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(torch.nn.functional, "relu", interrupted)
    with pytest.raises(KeyboardInterrupt):
        detect(lambda: nn.ReLU()(torch.ones(2)))
    assert torch._C._len_torch_dispatch_stack() == 0


def test_a_mask_a_region_passes_on_keeps_the_record_of_where_it_was_written():
    kept = {}

    def build():
        kept["mask"] = torch.full((4, 4), float("-inf")).triu(1)
        kept["out"] = nn.Sequential(nn.Flatten(0), nn.Identity())(kept["mask"])  # replayed: non-finite

    records = detect(build).detector.records
    assert records.get(kept["mask"]) is not None
    assert records.get(kept["out"]) is records.get(kept["mask"])


# -- a loss called as a function ---------------------------------------------------------

def _classify(label_smoothing=0.0):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    return lambda: F.cross_entropy(model(x), y, label_smoothing=label_smoothing).backward()


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_cross_entropy_called_as_a_function_runs_no_op_through_python(monkeypatch, label_smoothing):
    step = _classify(label_smoothing)
    seen = ops_through_the_mode(monkeypatch)
    assert not detect(step).stopped
    assert seen == []
    assert not detect(step, module_regions=False).stopped
    assert torch.ops.aten._log_softmax.default in seen  # (op by op, what the replay runs)


def test_the_backward_of_a_function_region_keeps_the_users_line():
    # The nodes built inside F.cross_entropy are noted at the line that called it: an
    # infinite gradient made there (3e38, weighted by 10) is reported at that line.
    def train():
        torch.manual_seed(0)
        logits = nn.Linear(4, 3)(torch.randn(5, 4))
        loss = F.cross_entropy(logits, torch.tensor([0, 1, 2, 1, 0]), weight=torch.full((3,), 10.0), reduction="sum")
        loss.backward(torch.tensor(3e38))

    found = detect(train).detection
    assert found.root.phase == "backward" and found.root.backward_node == "NllLossBackward0"
    assert found.root.location.code.startswith("loss = F.cross_entropy(logits")
    assert _what_a_report_says(detect(train)) == _what_a_report_says(detect(train, module_regions=False))


def test_a_loss_that_raises_puts_the_mode_back():
    def train():
        try:
            F.cross_entropy(torch.randn(2, 3), torch.tensor([0, 7]))  # a target out of range
        except IndexError:
            pass
        torch.log(torch.zeros(1, requires_grad=True)).sum().backward()  # still checked op by op

    found = detect(train).detection
    assert found is not None and found.root.op == "aten.log.default"


def test_a_compiled_or_scripted_loss_is_torchs_own_function():
    # Dynamo traces through the wrapper to torch's C function (fullgraph: no break), and
    # TorchScript finds the wrapper as aten::cross_entropy_loss; both give plain python's loss.
    logits, target = torch.randn(6, 4), torch.tensor([0, 1, 2, 3, 0, 1])

    def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(x, y, label_smoothing=0.1)

    plain = loss(logits, target)
    results = []

    def train():
        torch._dynamo.reset()
        results.append(torch.compile(loss, fullgraph=True, backend="eager")(logits, target))
        results.append(torch.jit.script(loss)(logits, target))

    assert not detect(train).stopped
    assert all(torch.equal(r, plain) for r in results) and len(results) == 2


def test_the_run_leaves_no_global_module_hook_behind():
    # torch's handle of a hook registered with_kwargs leaves its mark in a dict of its own;
    # left there, every call of a torch.compile'd module warns of global hooks after the run.
    from torch.nn.modules import module as torch_module

    def global_hooks():
        return {name: dict(hooks) for name, hooks in vars(torch_module).items() if name.startswith("_global_")
                and isinstance(hooks, dict)}

    before = global_hooks()
    assert not detect(lambda: nn.Linear(2, 1)(torch.ones(1, 2))).stopped
    assert global_hooks() == before



def _a_block_that_overflows(*, checkpointed: bool):
    from torch.utils.checkpoint import checkpoint

    block = nn.Sequential(_linear([[1e20, 1e20]]), nn.SiLU(), _linear([[1.0], [1.0]]), _linear([[1.0, -1.0]]))
    opt = torch.optim.SGD(block.parameters(), lr=0.1)  # (the loss is checked at its step, after backward)
    x = torch.tensor([[1e20, 1e20]])
    y = checkpoint(block, x, use_reentrant=False) if checkpointed else block(x)
    y.sum().backward()
    opt.step()


def test_non_reentrant_checkpointing_gives_the_answer_it_gives_without_although_regions_were_replayed():
    # A replay, and nandoctor's own checks of tensors that require grad, save nothing in
    # the script's graph: else the checkpoint's recomputation in backward does not match
    # what it counted in forward, and raises a CheckpointError the script never raises.
    plain = detect(lambda: _a_block_that_overflows(checkpointed=False)).detection
    found = detect(lambda: _a_block_that_overflows(checkpointed=True)).detection
    assert found is not None and found.reason is plain.reason
    assert (found.root.op, found.root.module) == (plain.root.op, plain.root.module) == ("aten.mm.default", "0")
