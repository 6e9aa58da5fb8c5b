"""Device-side flags: on an accelerator, each checked op queues a finiteness flag on the
device instead of reading its result on the host (a sync per op); the flags are read at
step boundaries. CI has no GPU, so these tests use `device_flags: always`, which takes the
same path for CPU tensors."""
from __future__ import annotations

import math

import pytest
import torch

from helpers import ATAN2_NAN_AT_ORIGIN, ATAN2_REASON, detect, run_nandoctor
from nandoctor.detect import device_flags
from nandoctor.detect import mode as checking_mode
# Imported before any test patches the mode's `_finite` (no_host_reads): the detector's
# parts (regions, node checks) bind it at import, and must bind the real one.
import nandoctor.detect.detector  # noqa: F401,E402
from nandoctor.detect.device_flags import DeviceFlags, FlaggedOp, HostRead
from nandoctor.config import load_config
from nandoctor.errors import ConfigError


def entry(name: str) -> FlaggedOp:
    return FlaggedOp(name, "forward", torch.float32, None, None, None, None, None)


def block_training(optimizer, steps: int, around_the_step=(lambda: None, lambda: None)):
    """`steps` training steps of a TinyBlock; `around_the_step` runs just before and after
    each `optimizer.step()`."""
    torch.manual_seed(0)
    block = TinyBlock()
    opt = optimizer(block.parameters(), lr=1e-3)
    before, after = around_the_step

    def train():
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.mse_loss(block(torch.randn(2, 5, 8)), torch.zeros(2, 5, 8)).backward()
            before()
            opt.step()
            after()

    return train


class TestHostRead:
    @pytest.mark.parametrize("one_transfer", [True, False])
    def test_values_come_back_exact_and_in_the_order_queued(self, one_transfer):
        transfer = HostRead(one_transfer)
        places = [transfer.add(torch.tensor(3.5, dtype=torch.float16)),
                  transfer.add(torch.tensor([[1e-30, float("nan")], [float("-inf"), 2.0]])),
                  transfer.add(torch.tensor(1e300, dtype=torch.float64)),  # past float32: kept whole
                  transfer.add(torch.tensor([0, 2, 1], dtype=torch.uint8))]
        host = transfer.read()
        assert places == [0, 1, 2, 3]
        assert list(host[0]) == [3.5] and list(host[2]) == [1e300] and list(host[3]) == [0, 2, 1]
        assert host[1][0] == torch.tensor(1e-30).item() and math.isnan(host[1][1]) and list(host[1][2:]) == [-math.inf, 2.0]

    def test_one_transfer_is_one_read_of_the_host(self, monkeypatch):
        transfers = []
        real_to_host = device_flags.to_host
        monkeypatch.setattr(device_flags, "to_host", lambda t: (transfers.append(t.numel()), real_to_host(t))[1])
        transfer = HostRead()
        for value in (torch.tensor(1.0), torch.ones(3), torch.tensor(2.0, dtype=torch.float64)):
            transfer.add(value)
        transfer.read()
        assert transfers == [5]

    def test_the_flags_of_a_boundary_travel_with_its_other_numbers(self):
        flags = DeviceFlags("always")
        flags.add(torch.tensor([1.0, float("-inf")]), entry("mask"))
        transfer = HostRead()
        flagged = flags.take(transfer)
        loss = transfer.add(torch.tensor(0.25))
        host = transfer.read()
        assert [(f.entry.func, f.has_nan) for f in flagged(host)] == [("mask", False)]
        assert host[loss].tolist() == [0.25] and len(flags) == 0


class TestFlags:
    def test_finite_outputs_leave_no_flag(self):
        flags = DeviceFlags("always")
        flags.add(torch.tensor([1.0, -2.0]), entry("a"))
        flags.add(torch.full((4,), 3e38), entry("big"))  # huge but finite: min/max cannot overflow
        assert flags.read() == []
        assert len(flags) == 0

    def test_read_gives_the_flagged_ops_in_order_and_tells_nan_from_inf(self):
        flags = DeviceFlags("always")
        flags.add(torch.tensor([1.0]), entry("fine"))
        flags.add(torch.tensor([1.0, float("-inf")]), entry("inf"))
        flags.add(torch.tensor([float("inf"), float("nan")]), entry("nan"))
        flagged = flags.read()
        assert [(f.entry.func, f.has_nan) for f in flagged] == [("inf", False), ("nan", True)]
        assert flags.read() == []  # a read consumes the flags

    def test_half_precision_flags_are_read_with_the_rest(self):
        flags = DeviceFlags("always")
        flags.add(torch.tensor([1.0], dtype=torch.float16), entry("half"))
        flags.add(torch.tensor([float("nan")], dtype=torch.bfloat16), entry("bf16"))
        assert [f.entry.func for f in flags.read()] == ["bf16"]

    @pytest.mark.parametrize("setting, cpu_deferred", [("auto", False), ("never", False), ("always", True)])
    def test_auto_defers_only_accelerator_tensors(self, setting, cpu_deferred):
        assert DeviceFlags(setting).wants(torch.ones(2)) is cpu_deferred  # (no accelerator in CI)

    def test_meta_tensors_are_never_deferred(self):
        assert not DeviceFlags("always").wants(torch.ones(2, device="meta"))

    def test_an_unknown_setting_is_a_config_error(self):
        with pytest.raises(ConfigError, match="device_flags"):
            load_config().with_overrides("run", device_flags="sometimes")


def no_host_reads(monkeypatch):
    """Make the per-op host check fail loudly: deferred ops must never call it, nor a
    module region's check of its output or a backward node's of its gradients."""
    from nandoctor.detect import nodes, regions

    def host_read(t):
        raise AssertionError("a per-op host read in a deferred run")

    for module in (checking_mode, regions, nodes):
        monkeypatch.setattr(module, "_finite", host_read)


class TinyBlock(torch.nn.Module):
    """A pre-norm Transformer block of a user's own: its layer norms and linears are torch.nn
    regions, its attention (SDPA: several outputs) runs op by op."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.norm, self.qkv, self.out = torch.nn.LayerNorm(dim), torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        return x + self.out(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))


class TestDeferredDetection:
    def test_a_forward_nan_stops_at_the_boundary_naming_the_op_and_line(self, monkeypatch):
        no_host_reads(monkeypatch)
        w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))

        def train():
            loss = torch.sqrt(w).sum()  # MARK-sqrt
            loss.backward()

        result = detect(train, device_flags="always")
        assert result.stopped
        root = result.detection.root
        assert root.op == "aten.sqrt.default" and root.phase == "forward"
        assert root.location.code == "loss = torch.sqrt(w).sum()  # MARK-sqrt"
        assert root.facts.device_flag == "nan" and result.detection.needs_replay
        assert root.output is None and root.inputs == []  # the values are gone by the boundary

    def test_a_training_step_makes_no_host_read_per_op_region_or_node(self, monkeypatch):
        """On a GPU each read is a sync: a layer norm's three outputs, attention's outputs,
        a region's output and a backward node's gradients are all flagged, not read."""
        no_host_reads(monkeypatch)
        detected = detect(block_training(torch.optim.AdamW, steps=2), device_flags="always")
        assert not detected.stopped
        assert detected.detector.deferred.were_read

    def test_a_training_step_reads_the_host_once_at_its_step(self, monkeypatch):
        """On a GPU every read is a sync: the flags, the loss and the gradients' norm are
        read in one transfer before the update, the parameters' check after it is a flag too."""
        events: list[str] = []
        for name in ("item", "tolist", "__bool__"):
            real = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, lambda t, *a, _real=real, **k: (events.append("read"), _real(t, *a, **k))[1])
        real_to_host = device_flags.to_host
        monkeypatch.setattr(device_flags, "to_host", lambda t: (events.append("read"), real_to_host(t))[1])
        train = block_training(torch.optim.SGD, steps=3, around_the_step=(lambda: events.append("step"),
                                                                         lambda: events.append("stepped")))
        assert not detect(train, device_flags="always").stopped
        steps = "".join("r" if e == "read" else "[" if e == "step" else "]" for e in events)
        # After the first step (which reads at backward, before the optimizer is known, and
        # checks the parameters once): one read, inside the step, before the update. The
        # causal mask's -inf is flagged and read as a suspect in that same transfer.
        later = steps.split("]")[1:-1]
        assert later == ["[r", "[r"], steps

    def test_a_step_whose_loss_is_nan_reads_once_and_stops_before_the_update(self, monkeypatch):
        transfers = []
        real_to_host = device_flags.to_host
        monkeypatch.setattr(device_flags, "to_host", lambda t: (transfers.append(t.numel()), real_to_host(t))[1])
        w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
        opt = torch.optim.SGD([w], lr=0.1)

        def train():
            for step in range(3):
                opt.zero_grad()
                if step == 2:
                    transfers.clear()
                loss = w.sum() * (float("nan") if step == 2 else 1.0)  # MARK-nan-loss
                loss.backward()
                opt.step()

        result = detect(train, device_flags="always")
        assert result.stopped and result.detection.reason.name in ("LOSS", "OP_MADE_NAN")
        root = result.detection.root
        assert (root.step, root.phase) == (2, "forward") and root.location.code.endswith("# MARK-nan-loss")
        two_updates = torch.tensor([1.0, 2.0]).add_(torch.ones(2), alpha=-0.1).add_(torch.ones(2), alpha=-0.1)
        assert torch.equal(w.detach(), two_updates)  # not the third
        assert len(transfers) == 1, transfers  # the flags, the loss and the norm together

    def test_a_nan_made_inside_a_module_region_is_flagged_with_the_region_and_line(self, monkeypatch):
        no_host_reads(monkeypatch)
        poisson = torch.nn.PoissonNLLLoss(log_input=False)  # log(rate): NaN for a negative rate
        w, target = torch.nn.Parameter(torch.tensor([1.0, -2.0])), torch.ones(2)

        def train():
            loss = poisson(w * 3, target)  # MARK-region
            loss.backward()

        result = detect(train, device_flags="always")
        assert result.stopped and result.detection.needs_replay  # the replay, op by op, finds the log
        root = result.detection.root
        assert root.op == "torch.nn.PoissonNLLLoss" and root.facts.device_flag == "nan"
        assert root.location.code == "loss = poisson(w * 3, target)  # MARK-region"

    def test_a_nan_made_by_a_backward_node_stops_before_the_update(self, monkeypatch):
        no_host_reads(monkeypatch)
        w = torch.nn.Parameter(torch.tensor([0.0, 1.0]))
        opt = torch.optim.SGD([w], lr=0.1)

        def train():
            (torch.sqrt(w * w) * 0).sum().backward()  # 0/0 in SqrtBackward0 only
            opt.step()

        result = detect(train, device_flags="always")
        assert result.stopped and result.detection.needs_replay
        assert torch.equal(w.detach(), torch.tensor([0.0, 1.0]))  # not updated

    @staticmethod
    def _half_precision_policy(overflow: bool):
        """A float16 classifier over masked logits (-inf where a class is not allowed): the
        LogSoftmax region passes the -inf on, and the loss leaves it out. Or a scale that
        overflows float16 on the way to the loss."""
        torch.manual_seed(0)
        lin = torch.nn.Linear(4, 5).half()
        log_softmax = torch.nn.LogSoftmax(dim=-1)
        opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        allowed = torch.tensor([True, True, False, True, False])
        x = torch.randn(3, 4).half()

        def train():
            for _ in range(2):
                logits = lin(x).masked_fill(~allowed, float("-inf")) * (1e5 if overflow else 1.0)
                loss = -log_softmax(logits)[:, allowed].mean()
                opt.zero_grad()
                loss.backward()
                opt.step()

        return train

    def test_a_float16_minus_inf_mask_passed_through_a_region_is_not_an_overflow(self):
        """A flag cannot tell a mask passed on from an overflow: in float16 its Inf is a
        suspect, not a stop (per-op tracing follows the mask by its record)."""
        assert not detect(self._half_precision_policy(overflow=False), device_flags="always").stopped

    def test_near_miss_a_float16_overflow_that_reaches_the_loss_still_stops_before_the_update(self):
        result = detect(self._half_precision_policy(overflow=True), device_flags="always")
        assert result.stopped and result.detection.needs_replay

    def test_a_value_read_back_reads_the_pending_flags_first(self):
        result = detect(lambda: torch.log(torch.tensor([-1.0])).tolist(), device_flags="always")
        assert result.stopped  # no backward, no optimizer: the read is the boundary
        assert result.detection.root.op == "aten.log.default" and result.detection.root.facts.device_flag == "nan"

    def test_flags_still_pending_when_the_script_ends_are_read_and_counted(self):
        from nandoctor.config import load_config
        from nandoctor.detect.detector import Detector

        detector = Detector(dict(load_config().run, device_flags="always"))
        with detector:
            torch.log(torch.tensor([-1.0]))  # never read: it did not matter
            detector.finish()
        assert detector.detection is None
        assert [(d.op, d.made) for d in detector.discarded()] == [("aten.log.default", "nan")]

    def test_a_value_whose_lineage_the_flags_lost_is_traced_to_the_flagged_op(self):
        def run():
            z = torch.tensor([[1000.0, 0.0]])
            p = torch.exp(z) / torch.exp(z).sum(1, keepdim=True)  # MARK-flagged: inf / inf
            # nll_loss returns two tensors: checked on the host, its NaN input has no record
            torch.nn.functional.nll_loss(torch.log(p), torch.tensor([0])).item()

        result = detect(run, device_flags="always")
        assert result.detection.needs_replay  # the replay, checking each op at once, finds exp
        root = result.detection.root  # until then: the first flagged NaN
        assert root.facts.device_flag == "nan" and root.op == "aten.div.Tensor"
        assert "MARK-flagged" in root.location.code

    def test_a_minus_inf_attention_mask_is_still_legitimate(self):
        def attend():
            layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
            mask = torch.full((5, 5), float("-inf")).triu(1)
            layer(torch.randn(2, 5, 16), src_mask=mask).sum().backward()

        assert not detect(attend, device_flags="always").stopped

    @pytest.mark.skipif(ATAN2_NAN_AT_ORIGIN, reason=ATAN2_REASON)
    def test_inf_masked_inside_backward_does_not_stop(self):
        def heading():
            v = torch.zeros(4, 2, requires_grad=True)
            torch.atan2(v[:, 1], v[:, 0]).sum().backward()

        assert not detect(heading, device_flags="always").stopped

    def test_a_gradient_leak_stops_before_the_update_with_the_flagged_suspects_as_candidates(self):
        lin = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        x, target = torch.randn(8, 3), torch.tensor([1.0, 0.0] * 4)
        before = [p.detach().clone() for p in lin.parameters()]

        def train():
            rel = (lin(x).squeeze(1) - target) / target
            rel[target != 0].abs().mean().backward()
            opt.step()

        result = detect(train, device_flags="always")
        assert result.stopped
        assert all(torch.equal(a, b) for a, b in zip(before, lin.parameters()))
        assert result.detection.needs_replay
        assert "aten.div.Tensor" in [site.op for site in result.detection.flagged_suspects]


ONCE = """\
import os
import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(64, 8)
for step in range(6):
    opt.zero_grad()
    out = model(x)
    if step == 3 and os.path.exists("inject.flag"):
        os.remove("inject.flag")  # a one-off: gone when the run is repeated
        out = torch.sqrt(out - 100)
    loss = out.pow(2).mean()
    loss.backward()
    opt.step()
"""


class TestEndToEnd:
    @pytest.fixture
    def always(self, tmp_path):
        (tmp_path / "flags.yaml").write_text("run:\n  device_flags: always\n")
        return ["--config", "flags.yaml"]

    def test_a_flagged_op_is_localised_by_replay_with_its_values(self, tmp_path, script, always):
        script("train.py", ONCE.replace('os.path.exists("inject.flag")', "True").replace(
            '        os.remove("inject.flag")  # a one-off: gone when the run is repeated\n', ""))
        result = run_nandoctor(["run", *always, "train.py"], tmp_path)
        assert result.code == 3, result.stderr
        report = result.report
        assert report["reproduced"] is True
        assert report["root"]["op"] == "aten.sqrt.default" and report["root"]["location"]["line"] == 12
        assert report["root"]["inputs"][0]["negatives"] == 64  # the replay has the values
        assert report["cause"]["id"] == "sqrt_negative"

    def test_a_flagged_op_that_does_not_come_back_keeps_its_op_and_line(self, tmp_path, script, always):
        script("train.py", ONCE)
        (tmp_path / "inject.flag").write_text("")
        result = run_nandoctor(["run", *always, "train.py"], tmp_path)
        assert result.code == 3, result.stderr
        report = result.report
        assert report["reproduced"] is False
        assert report["cause"]["id"] == "nonreproducible"
        assert report["root"]["op"] == "aten.sqrt.default" and report["root"]["location"]["line"] == 13
        assert report["step"] == 3
        assert "NaN in forward" in result.stderr

    def test_a_module_region_flagged_on_the_device_is_replayed_to_its_op(self, tmp_path, script, always):
        script("train.py", POISSON_RATE)
        result = run_nandoctor(["run", *always, "train.py"], tmp_path)
        assert result.code == 3, result.stderr
        assert "the output of torch.nn.PoissonNLLLoss went non-finite" in result.stderr
        assert "checking every op as it runs" in result.stderr
        report = result.report
        assert report["reproduced"] is True
        assert report["root"]["op"] == "aten.log.default" and report["root"]["location"]["line"] == 11
        assert report["cause"]["id"] == "log_nonpositive"


# A Poisson regression whose rate is a raw linear output: PoissonNLLLoss(log_input=False)
# takes its log inside the module (a region), NaN for the negative rates at line 11.
POISSON_RATE = """\
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
loss_fn = torch.nn.PoissonNLLLoss(log_input=False)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, counts = torch.randn(32, 4), torch.poisson(torch.full((32, 1), 3.0))
for step in range(5):
    opt.zero_grad()
    rate = model(x)
    loss = loss_fn(rate, counts)
    loss.backward()
    opt.step()
"""
