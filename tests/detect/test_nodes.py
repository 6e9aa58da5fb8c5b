"""A plain CPU backward checked node by node (detect/nodes.py): the per-op mode is off while
autograd runs its own nodes, and every answer is the one a per-op backward gives.

Each scenario below runs twice, node by node (the default) and op by op
(`backward_by_node=False`, what the replay runs), and the two detections must agree on
everything a report says: the root op, its backward node, phase, line, the reason, and the
lineage. The healthy twins must not stop either way.
"""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

from helpers import detect, ops_through_the_mode, run_nandoctor


def _sqrt_at_zero():
    w = torch.nn.Parameter(torch.tensor([0.0, 1.0]))
    (torch.sqrt(w * 2) * 3).sum().backward()


def _masked_division():
    x = torch.nn.Parameter(torch.tensor([0.0, 2.0]))
    y = torch.where(x > 0, 1 / x, torch.zeros_like(x))  # the NaN gradient of the unused 1/0
    y.sum().backward()


def _summed_by_the_engine():
    # Two uses of `a`: the engine sums their gradients before a's node, out of the mode's sight.
    w = torch.nn.Parameter(torch.tensor([0.0, 4.0]))
    a = torch.sqrt(w)
    (a * 2 + a.exp()).sum().backward()


def _accumulated_into_an_existing_grad():
    w = torch.nn.Parameter(torch.tensor([0.0, 4.0]))
    (w * 2).sum().backward()  # a finite .grad first (micro-batches)
    torch.sqrt(w).sum().backward()


def _a_linear_model_with_a_log_in_the_loss():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x = torch.randn(16, 4)
    out = model(x)
    (out - out.detach()).abs().pow(0.5).mean().backward()  # |0| ** 0.5: an infinite gradient


class _Halve(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x / 2

    @staticmethod
    def backward(ctx, grad):
        return grad / (grad - grad)  # 0 / 0 in the user's own backward


def _a_custom_function_into_an_existing_grad():
    # The leaves' accumulators are hooked only once a value went non-finite: here in the
    # user's Python code, which runs op by op, before the engine adds into w.grad.
    w = torch.nn.Parameter(torch.ones(3))
    (w * 2).sum().backward()  # a finite .grad first (micro-batches)
    _Halve.apply(w).sum().backward()


def _a_parameter_hook_into_an_existing_grad():
    w = torch.nn.Parameter(torch.tensor([1.0, 4.0]))
    (w * 2).sum().backward()
    w.register_hook(lambda g: g / (g - g))  # runs just before w's own accumulator
    (w * 3).sum().backward()


def _a_custom_function():
    w = torch.nn.Parameter(torch.ones(3))
    _Halve.apply(w * 2).sum().backward()


def _a_tensor_hook():
    w = torch.nn.Parameter(torch.ones(2))
    y = w * 3
    y.register_hook(lambda g: (g - 1).log())
    y.sum().backward()


def _retained_graph_twice():
    w = torch.nn.Parameter(torch.tensor([0.0, 1.0]))
    y = torch.sqrt(w + 1) * 2
    y.sum().backward(retain_graph=True)
    (y * torch.tensor([float("inf"), 1.0])).sum().backward()


def _checkpointed(*, use_reentrant: bool):
    def scenario():
        from torch.utils.checkpoint import checkpoint

        w = torch.nn.Parameter(torch.tensor([0.0, 1.0]))
        y = checkpoint(lambda v: torch.sqrt(v * 2) * 3, w, use_reentrant=use_reentrant)
        y.sum().backward()

    scenario.__name__ = f"_checkpointed_{'reentrant' if use_reentrant else 'non_reentrant'}"
    return scenario


def _a_gradient_scaler_in_float16():
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0)
    for _ in range(3):  # every step skipped: at a scale of 1 the scaler can do no more
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(torch.ones(8, 4)).float()
        opt.zero_grad()
        scaler.scale(torch.sqrt(out * 0).mean()).backward()
        scaler.step(opt)
        scaler.update()


# Healthy twins: non-finite values made inside backward and masked before any gradient.
def _an_infinite_gradient_masked_by_a_clamp():
    x = torch.nn.Parameter(torch.tensor([0.0, 2.0]))
    b = x.clamp(min=0.5)
    torch.sqrt(b - 0.5).sum().backward()  # sqrt'(0) = inf, but clamp passes no gradient at x=0


def _atan2_at_the_origin():
    x = torch.nn.Parameter(torch.tensor([0.0, 1.0]))
    torch.atan2(x * 0, x * 0 + 1).sum().backward()

def _a_cast_to_float16_that_overflows_in_backward():
    # x.float(): its backward casts the float32 gradient back to float16, past 65504.
    x = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
    (x.float() * 1e5).sum().backward()


BROKEN = [_sqrt_at_zero, _masked_division, _summed_by_the_engine, _accumulated_into_an_existing_grad,
          _a_linear_model_with_a_log_in_the_loss, _a_custom_function, _a_tensor_hook, _retained_graph_twice,
          _a_custom_function_into_an_existing_grad, _a_parameter_hook_into_an_existing_grad,
          _checkpointed(use_reentrant=True), _a_gradient_scaler_in_float16,
          _a_cast_to_float16_that_overflows_in_backward]
HEALTHY = [_an_infinite_gradient_masked_by_a_clamp, _atan2_at_the_origin]


def _what_a_report_says(detected) -> tuple:
    """Everything but one step: op by op, a .grad that already held a value shows the
    engine's add into it (AccumulateGrad) as the lineage's last step; node by node the
    engine does that add out of sight, and the lineage ends at the op that made the value."""
    d = detected.detection
    site = lambda s: (s.op, s.phase, s.backward_node, s.location.line if s.location else None)  # noqa: E731
    return d.reason, site(d.root), [site(s) for s in d.lineage if s.backward_node != "AccumulateGrad"]


@pytest.mark.parametrize("scenario", BROKEN, ids=lambda f: f.__name__.strip("_"))
def test_node_by_node_finds_what_op_by_op_finds(scenario):
    by_node = detect(scenario)
    by_op = detect(scenario, backward_by_node=False)
    assert by_node.stopped and by_op.stopped
    assert _what_a_report_says(by_node) == _what_a_report_says(by_op)
    assert by_node.detection.root.op and not by_node.detection.needs_replay  # the exact op, not just the node


def test_a_node_that_cannot_run_again_is_named_and_left_to_the_replay():
    # Non-reentrant checkpointing recomputes a node's saved tensors for one use only: the
    # node cannot run a second time, op by op. The report names the node and its forward
    # line, and asks for the seeded replay, which checks backward op by op, for the op.
    scenario = _checkpointed(use_reentrant=False)
    by_node, by_op = detect(scenario), detect(scenario, backward_by_node=False)
    root, exact = by_node.detection.root, by_op.detection.root
    assert by_node.detection.needs_replay and root.op == ""
    assert (root.backward_node, root.location.line) == (exact.backward_node, exact.location.line)


@pytest.mark.parametrize("scenario", HEALTHY, ids=lambda f: f.__name__.strip("_"))
def test_values_masked_inside_backward_stop_neither(scenario):
    assert not detect(scenario).stopped
    assert not detect(scenario, backward_by_node=False).stopped


def _hooked_nodes(loss) -> dict:
    """Each node's name in `loss`'s graph -> whether nandoctor hooked it (one per node)."""
    hooked: dict = {}
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None:
            hooked.setdefault(node.name(), []).append("nandoctor.armed" in node.metadata)
            stack.extend(fn for fn, _ in node.next_functions)
    return hooked


def test_only_nodes_that_can_make_a_non_finite_gradient_are_hooked():
    # A hook costs 3-7 µs to register each step: nodes that only move, select or widen a
    # gradient get none (ReLU's backward keeps or zeroes it; a cast up from bfloat16 cannot
    # overflow on its way back). A cast down to float16 and a matmul can, and are hooked.
    w = torch.nn.Parameter(torch.ones(4, 4))
    h = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.relu(torch.ones(2, 4) @ w)
    loss = (y.float() + h.float()).sum()
    hooked = {}
    detect(lambda: (loss.backward(retain_graph=True), hooked.update(_hooked_nodes(loss))))
    assert hooked["ReluBackward0"] == [False]
    assert hooked["MmBackward0"] == [True]
    # Back up to float32 for w (autocast's cast of the weight); back down to bfloat16 for y
    # and to float16 for h, which can round past the narrower type's largest value.
    assert sorted(hooked["ToCopyBackward0"]) == [False, True, True]


def _a_float16_weight_gradient_that_overflows():
    # Forward stays in range; the first layer's weight gradient, a sum over 1024 rows of
    # 200 x 400, passes float16's 65504 in the matmul that hands it to the accumulator.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)).half()
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    opt.zero_grad()
    model(torch.full((1024, 4), 200.0, dtype=torch.float16)).float().sum().backward()
    opt.step()


def test_what_a_matmul_hands_a_weights_grad_is_left_to_the_step_and_its_replay():
    # With an optimizer in the run, the step reads every .grad before any update: checking
    # a weight's gradient where the matmul made it too would read it twice each step. An
    # overflow there stops the step instead, and the replay (op by op) names the matmul.
    by_node = detect(_a_float16_weight_gradient_that_overflows)
    by_op = detect(_a_float16_weight_gradient_that_overflows, backward_by_node=False)
    assert by_node.stopped and by_node.detection.needs_replay
    assert by_node.detection.reason.name == "GRADIENT_BEFORE_STEP"
    assert (by_op.detection.root.op, by_op.detection.root.backward_node) == ("aten.mm.default", "AddmmBackward0")


def test_without_an_optimizer_what_a_matmul_hands_a_leaf_is_checked_at_once():
    # No step will read the .grad (a hand-written update, autograd for its own sake): the
    # node checks all it makes, and the op is named without a replay.
    def no_optimizer():
        w = torch.nn.Parameter(torch.full((1, 4), 1.0, dtype=torch.float16))
        (torch.full((1024, 4), 200.0, dtype=torch.float16) @ w.t()).float().sum().backward()

    detected = detect(no_optimizer)
    assert detected.stopped and not detected.detection.needs_replay
    assert detected.detection.root.backward_node == "MmBackward0"


def test_with_the_step_checking_the_gradients_a_matmul_goes_unhooked():
    # A plain backward with an optimizer in the run: the step reads every gradient it
    # applies, so a node that can only overflow (a matmul, a layer norm, an add) is left
    # to it, and only the nodes that can make a NaN or Inf of finite values are hooked.
    seen = {}

    def step():
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.LayerNorm(8), torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = model(torch.randn(16, 4)).pow(2).mean()
        loss.backward(retain_graph=True)
        seen.update(_hooked_nodes(loss))
        opt.step()

    assert not detect(step).stopped
    assert seen["AddmmBackward0"] == [False, False] and seen["NativeLayerNormBackward0"] == [False]
    assert seen["TanhBackward0"] == [False]  # a bounded derivative: 1 - tanh², of its finite output
    assert seen["PowBackward0"] == [True]


def _walks_per_step(monkeypatch, forward, steps: int = 4) -> list[int]:
    """How many times each step's backward walked its graph to hook its nodes."""
    from nandoctor.detect.nodes import NodeChecks

    walks = []
    walk = NodeChecks._walk_and_hook
    monkeypatch.setattr(NodeChecks, "_walk_and_hook", lambda self: (walks.append(1), walk(self))[1])
    counts = []

    def train():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(steps):
            opt.zero_grad()
            before = len(walks)
            forward(model, step).backward()
            counts.append(len(walks) - before)
            opt.step()

    assert not detect(train).stopped
    return counts


def _a_loss_of_torch_nn(model, step):
    return torch.nn.functional.cross_entropy(model(torch.randn(16, 4)), torch.randint(0, 3, (16,)))


def _a_loss_written_op_by_op(model, step):
    return torch.tanh(model(torch.randn(16, 4))).mean()  # (ops through the mode: tanh, mean)


@pytest.mark.parametrize("forward", [_a_loss_of_torch_nn, _a_loss_written_op_by_op], ids=["regions", "op-by-op"])
def test_a_graph_with_nothing_to_hook_is_walked_once(monkeypatch, forward):
    # No node that can make a NaN of finite values (matmuls, GELU, a log-softmax, tanh, a
    # mean): the first step's walk finds nothing to hook, and the same graph built again
    # by the same regions and ops the next steps is not walked.
    assert _walks_per_step(monkeypatch, forward) == [1, 0, 0, 0]


def test_near_miss_a_graph_with_a_node_to_hook_is_walked_every_step(monkeypatch):
    # The square root's backward can make an Inf of finite values (at 0): hooked each step.
    forward = lambda model, step: torch.sqrt(model(torch.randn(16, 4)).pow(2).sum())  # noqa: E731
    assert _walks_per_step(monkeypatch, forward) == [1, 1, 1, 1]


def test_near_miss_a_graph_built_otherwise_is_walked_again(monkeypatch):
    # The third step's loss is made otherwise (mse_loss, its ops through the mode): a graph
    # not built before is walked; the fourth step's graph is the first one again.
    def forward(model, step):
        logits = model(torch.randn(16, 4))
        if step == 2:
            return torch.nn.functional.mse_loss(logits, torch.zeros(16, 3))
        return torch.nn.functional.cross_entropy(logits, torch.randint(0, 3, (16,)))

    assert _walks_per_step(monkeypatch, forward) == [1, 0, 1, 0]


def test_a_graph_not_walked_again_still_stops_at_the_step_on_an_overflow():
    # The three steps build the same graph (a torch.nn model, cross_entropy), walked once.
    # The third's inputs are 300 everywhere: its forward stays in float16's range, but the
    # first layer's weight gradient, a sum over 256 rows of them, passes 65504 in the
    # unhooked matmul. The step stops on it and asks for the replay.
    def train():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 3)).half()
        opt = torch.optim.SGD(model.parameters(), lr=1e-9)
        targets = torch.zeros(256, dtype=torch.long)
        for value in (1.0, 1.0, 300.0):
            opt.zero_grad()
            logits = model(torch.full((256, 4), value, dtype=torch.float16))
            torch.nn.functional.cross_entropy(logits, targets, reduction="sum").backward()
            opt.step()

    detected = detect(train)
    assert detected.stopped and detected.detection.needs_replay
    assert detected.detection.reason.name == "GRADIENT_BEFORE_STEP" and detected.detector.state.step == 2


def _a_float16_hidden_gradient_that_overflows(loss_scale: float = 1000.0):
    # Forward stays in range (|h| <= ~1 times weights of 100, summed in float32); the
    # gradient reaching the hidden layer, 1000 x 100 summed over 64 outputs, passes
    # float16's 65504 in the second Linear's matmul, then goes through a checked node
    # (the square root's backward) on its way to the first Linear's weights.
    def train():
        torch.manual_seed(0)
        first, second = torch.nn.Linear(4, 8).half(), torch.nn.Linear(8, 64).half()
        torch.nn.init.constant_(second.weight, 100.0)
        opt = torch.optim.SGD([*first.parameters(), *second.parameters()], lr=1e-9)
        opt.zero_grad()
        h = torch.sqrt(torch.sigmoid(first(torch.randn(1024, 4, dtype=torch.float16))))
        (second(h).float().sum() * loss_scale).backward()
        opt.step()

    return train


def test_an_overflow_in_an_unhooked_matmul_stops_the_step_and_asks_for_the_replay():
    # The Inf comes out of the unhooked matmul into sqrt's node, which is checked: it finds
    # a non-finite gradient arriving that no record names, made out of its sight. The step
    # stops on the weights' gradients, and the replay (op by op) names the matmul.
    by_node = detect(_a_float16_hidden_gradient_that_overflows())
    by_op = detect(_a_float16_hidden_gradient_that_overflows(), backward_by_node=False)
    assert by_node.stopped and by_node.detection.needs_replay
    assert by_node.detection.reason.name == "GRADIENT_BEFORE_STEP"
    assert by_node.detection.root.facts.made_out_of_sight
    assert (by_op.detection.root.op, by_op.detection.root.backward_node) == ("aten.mm.default", "AddmmBackward0")
    assert not by_op.detection.needs_replay


def test_near_miss_the_same_gradient_in_range_stops_neither():
    healthy = _a_float16_hidden_gradient_that_overflows(loss_scale=1e-3)
    assert not detect(healthy).stopped
    assert not detect(healthy, backward_by_node=False).stopped


@pytest.mark.parametrize("read_by", ["step-code", "tensor-hook"])
def test_a_gradient_made_out_of_sight_and_read_by_the_script_still_asks_for_the_replay(read_by):
    # The overflow is made in an unhooked node (the cast back to float16) and reaches the
    # .grad with no checked node on its way; the script's own code reads it first: it
    # divides the gradients by its loss scale before the step, or a tensor hook halves
    # the gradient inside backward. Those ops pass the Inf on as a gradient made out of
    # sight, not as a value from nowhere: the step stops on it and asks for the replay.
    def train():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 128)).half()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        pred = model(torch.randn(512, 16).half())
        if read_by == "tensor-hook":
            pred.register_hook(lambda g: g * 0.5)
        (((pred.float() - torch.randn(512, 128)) ** 2).sum() * 2.0 ** 16).backward()
        if read_by == "step-code":
            for p in model.parameters():
                p.grad /= 2.0 ** 16
        opt.step()

    detected = detect(train)
    assert detected.stopped and detected.detection.needs_replay
    assert detected.detection.reason.name == "GRADIENT_BEFORE_STEP"
    assert detected.detection.root.facts.made_out_of_sight


_GRADIENTS_READ_BEFORE_THE_STEP = """\
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 128)).half()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(512, 16).half(), torch.randn(512, 128)
for step in range(3):
    opt.zero_grad()
    pred = model(x)
    loss = ((pred.float() - y) ** 2).sum()
    (loss * 2.0 ** 16).backward()
    READ_THE_GRADIENTS
    opt.step()
"""


@pytest.mark.parametrize("reader", [
    "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)",
    'print("largest gradient", model[0].weight.grad.abs().max().tolist())',
], ids=["clipping-raises", "printed"])
def test_a_gradient_made_out_of_sight_that_the_script_reads_gets_the_op_from_the_replay(tmp_path, reader):
    # The script reads the gradients before any step: clip_grad_norm_ raises over their
    # non-finite norm, or a print reads their largest value (through ops that pass a value
    # on unchecked). What it read was made in a node left to the step; the report is the
    # replay's: the cast back to float16 in backward, at the loss's line.
    (tmp_path / "train.py").write_text(_GRADIENTS_READ_BEFORE_THE_STEP.replace("READ_THE_GRADIENTS", reader))
    result = run_nandoctor(["run", "train.py"], tmp_path)
    assert result.code == 3, result.stderr
    root = result.report["root"]
    assert (root["op"], root["backward_node"], root["location"]["line"]) == (
        "aten._to_copy.default", "ToCopyBackward0", 9)


def _count_backward_ops(monkeypatch) -> list:
    """The ops autograd runs that reach the per-op mode from now on."""
    return ops_through_the_mode(monkeypatch, backward_only=True)


def _a_healthy_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    torch.nn.functional.mse_loss(model(torch.randn(16, 4)), torch.randn(16, 1)).backward()


@pytest.mark.parametrize("by_node, through_python", [(True, False), (False, True)])
def test_a_healthy_backward_runs_no_op_through_python(monkeypatch, by_node, through_python):
    seen = _count_backward_ops(monkeypatch)
    assert not detect(_a_healthy_step, backward_by_node=by_node).stopped
    assert bool(seen) is through_python


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph")
def test_a_backward_that_builds_a_graph_stays_op_by_op(monkeypatch):
    seen = _count_backward_ops(monkeypatch)
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    assert not detect(lambda: (w ** 3).sum().backward(create_graph=True)).stopped
    assert seen  # its nodes' ops make a graph for a second backward: each is checked


def test_the_mode_is_back_on_after_a_backward_that_raised():
    w = torch.nn.Parameter(torch.ones(2))

    def refuse(grad):
        raise ValueError("no")

    def train():
        y = w * 2
        y.register_hook(refuse)
        with pytest.raises(ValueError):
            y.sum().backward()
        torch.log(w - 1).sum().backward()  # a forward NaN: found op by op again

    detected = detect(train)
    assert detected.stopped and detected.detection.root.op == "aten.log.default"


def test_a_gradient_the_engine_copies_into_grad_ends_the_lineage_at_the_layer_that_made_it():
    # Two calls of one encoder (a Siamese pair, one image paired with itself): the engine
    # sums the two calls' weight gradients into a new .grad, out of a node-by-node
    # backward's sight. The stop names that weight, and the lineage ends in its own layer.
    torch.manual_seed(0)
    encoder = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    images = torch.randn(6, 4)

    def train():
        ea, eb = encoder(images[[0, 1, 2]]), encoder(images[[0, 4, 5]])
        torch.sqrt(((ea - eb) ** 2).sum(dim=1)).sum().backward()

    d = detect(train).detection
    assert (d.root.op, d.root.backward_node) == ("aten.div.Tensor", "SqrtBackward0")
    parameter = d.event.facts.parameter.name  # e.g. "2.weight"
    assert d.event.module == parameter.split(".")[0] and d.event.backward_node == "AddmmBackward0"


def test_a_run_leaves_no_hook_on_the_parameters_it_watched():
    # A leaf's accumulator lives as long as a graph holds it (here one kept from before the
    # run): the next run in the process (a notebook, the benchmarks) must find neither this
    # run's hook nor its mark there, and nothing of the finished run may be kept alive.
    layer = torch.nn.Linear(3, 1)
    kept = layer(torch.ones(2, 3))  # its graph holds weight's accumulator across the run

    def train():
        layer(torch.ones(2, 3)).sum().backward()

    detected = detect(train)
    accumulator = kept.grad_fn.next_functions[2][0].next_functions[0][0]
    assert type(accumulator).__name__ == "AccumulateGrad" and not accumulator.metadata
    finished = weakref.ref(detected.detector)
    del detected
    gc.collect()
    assert finished() is None


def test_what_is_kept_of_the_leaves_accumulators_does_not_grow_with_the_steps():
    # Autograd makes a new accumulator per leaf per step (the last one dies with its graph):
    # only those still alive are remembered (bench_memory.py measures the whole run).
    layer = torch.nn.Linear(3, 1)
    sizes = []

    def train():
        from nandoctor.detect.detector import _RUNNING

        detector = next(iter(_RUNNING))
        for _ in range(50):
            layer(torch.ones(2, 3)).sum().backward()
            sizes.append(len(detector.nodes._lasting))

    assert not detect(train).stopped
    assert max(sizes) <= 2  # weight's and bias's, of the last step


def test_a_backward_whose_every_node_goes_non_finite_hooks_the_leaves_once(monkeypatch):
    """An integrator's rollout that overflowed makes every node of its long graph
    non-finite: the leaves' accumulators are hooked on the first, not searched for again
    on each (a walk of the whole graph per node made such a backward quadratic)."""
    from nandoctor.detect import nodes

    walks = []
    real = nodes._grad_fns
    monkeypatch.setattr(nodes, "_grad_fns", lambda roots: walks.append(roots) or real(roots))
    k = torch.nn.Parameter(torch.tensor(2.0))

    def rollout():
        s = torch.tensor([1.0, 0.0])
        for _ in range(50):
            s = s + 0.1 * torch.stack([s[1], -k * s[0]])
        torch.sqrt((s * 0).sum()).backward()  # sqrt'(0) = inf: every node behind it goes non-finite

    assert detect(rollout).stopped
    assert len(walks) <= 2  # (the nodes to hook, once; the leaves, once)
