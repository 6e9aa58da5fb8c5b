"""The parameters' pass after a step is left out where the update is proven finite
(detect/update_bounds.py), and runs wherever it is not."""
from __future__ import annotations

import pytest
import torch

from helpers import detect
from nandoctor.detect.boundaries import BoundaryChecks
from nandoctor.detect.result import StopReason
from nandoctor.detect.update_bounds import UpdateBounds

FLOAT32_MAX = torch.finfo(torch.float32).max


@pytest.fixture
def passes(monkeypatch) -> list:
    """The optimizers whose parameters were read after a step, one entry per pass."""
    read = []
    original = BoundaryChecks.after_step

    def after_step(self, optimizer):
        read.append(optimizer)
        return original(self, optimizer)

    monkeypatch.setattr(BoundaryChecks, "after_step", after_step)
    return read


def train(opt, params, steps: int = 3, loss=lambda params: sum((p * p).sum() for p in params)):
    for _ in range(steps):
        opt.zero_grad()
        loss(params).backward()
        opt.step()


def linear_params(dtype=torch.float32, grad=None):
    """A weight and a bias; with `grad` (a float), each with a gradient of that value."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 3, dtype=dtype)), torch.nn.Parameter(torch.randn(3, dtype=dtype))]
    for p in params if grad is not None else ():
        p.grad = torch.full_like(p, grad)
    return params


class TestLeftOut:
    @pytest.mark.parametrize("make", [
        lambda ps: torch.optim.Adam(ps, lr=1e-3),
        lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, amsgrad=True),
        lambda ps: torch.optim.SGD(ps, lr=0.1),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.5),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=5e-4),
    ], ids=["adam", "adamw_amsgrad", "sgd", "sgd_nesterov", "sgd_dampening", "sgd_weight_decay"])
    def test_torchs_sgd_adam_and_adamw_leave_out_the_pass(self, passes, make):
        params = linear_params()
        opt = make(params)
        result = detect(lambda: train(opt, params))
        assert not result.stopped and passes == []

    def test_an_optimizer_resumed_with_its_state_reads_the_state_once_and_leaves_out_the_pass(self, passes):
        params = linear_params()
        opt = torch.optim.Adam(params, lr=1e-3)
        train(opt, params)  # (before nandoctor: a state it did not see grow)
        result = detect(lambda: train(opt, params))
        assert not result.stopped and passes == []

    def test_an_update_under_the_threshold_keeps_the_largest_float_finite(self, passes):
        # max + 1e29 rounds back to max: no float32 step that small can leave the range.
        w = torch.nn.Parameter(torch.tensor([FLOAT32_MAX]))
        opt = torch.optim.SGD([w], lr=1e29)
        result = detect(lambda: train(opt, [w], steps=1, loss=lambda ps: -ps[0].sum()))
        assert not result.stopped and passes == [] and w.item() == FLOAT32_MAX


class TestStillRead:
    def test_near_miss_an_update_over_the_threshold_is_read_and_its_overflow_stops_the_step(self, passes):
        w = torch.nn.Parameter(torch.tensor([FLOAT32_MAX]))
        opt = torch.optim.SGD([w], lr=1e38)
        result = detect(lambda: train(opt, [w], steps=1, loss=lambda ps: -ps[0].sum()))
        assert result.stopped and result.detection.reason is StopReason.UPDATE and passes == [opt]

    def test_near_miss_weight_decay_on_huge_weights_is_read_and_its_momentum_overflow_stops_the_step(self, passes):
        # wd * p feeds the momentum buffer: 3e38, then 0.9 * 3e38 + 2.7e38 overflows at the second step.
        w = torch.nn.Parameter(torch.tensor([3e38]))
        opt = torch.optim.SGD([w], lr=0.1, momentum=0.9, weight_decay=1.0)
        result = detect(lambda: train(opt, [w], loss=lambda ps: 0 * ps[0].sum()))
        assert result.stopped and result.detection.reason is StopReason.UPDATE and len(passes) == 2

    def test_adam_with_eps_zero_is_read_and_its_zero_over_zero_stops_the_first_step(self, passes):
        embed = torch.nn.Embedding(5, 2)
        opt = torch.optim.Adam(embed.parameters(), lr=1e-3, eps=0.0)
        result = detect(lambda: train(opt, [embed], steps=2, loss=lambda ps: ps[0](torch.tensor([0, 1])).sum()))
        assert result.stopped and result.detection.reason is StopReason.UPDATE and len(passes) == 1

    @pytest.mark.parametrize("make", [
        lambda ps: torch.optim.Adam(ps, lr=1e-3, weight_decay=1e-4),
        lambda ps: torch.optim.RMSprop(ps, lr=1e-3),
        lambda ps: type("MyAdam", (torch.optim.Adam,), {})(ps, lr=1e-3),
    ], ids=["adam_l2_decay", "rmsprop", "adam_subclass"])
    def test_what_no_bound_covers_is_read_at_every_step(self, passes, make):
        params = linear_params()
        opt = make(params)
        result = detect(lambda: train(opt, params))
        assert not result.stopped and len(passes) == 3

    def test_float16_parameters_are_read(self, passes):
        params = linear_params(torch.float16)
        opt = torch.optim.SGD(params, lr=0.1)
        result = detect(lambda: train(opt, params))
        assert not result.stopped and len(passes) == 3

    def test_a_step_with_a_hook_of_its_own_is_read(self, passes):
        params = linear_params()
        opt = torch.optim.Adam(params, lr=1e-3)

        def clamp(optimizer, args, kwargs):
            with torch.no_grad():
                for p in params:
                    p.clamp_(-1, 1)

        opt.register_step_post_hook(clamp)
        result = detect(lambda: train(opt, params))
        assert not result.stopped and len(passes) == 3

    def test_a_step_after_a_compiled_call_is_read(self, passes):
        params = linear_params()
        opt = torch.optim.Adam(params, lr=1e-3)

        def run():
            square = torch.compile(lambda t: t * t, backend="eager")
            train(opt, params, loss=lambda ps: sum(square(p).sum() for p in ps))

        result = detect(run)
        # (The first step's parameters were read when it began, after the compiled call.)
        assert not result.stopped and len(passes) == 2


class TestBounds:
    """The bounds themselves, step by step (what the detector feeds them: the norm of the
    gradients before each step, then whether the step is proven after it)."""

    def step(self, bounds: UpdateBounds, opt, grad_norm: float) -> bool:
        bounds.gradients_applied(opt, grad_norm)
        opt.step()
        return bounds.proven_finite(opt)

    def test_adams_bound_grows_with_the_largest_gradient_norm_until_it_passes_the_threshold(self):
        params = linear_params(grad=0.0)
        opt, bounds = torch.optim.Adam(params, lr=1e-3), UpdateBounds()
        assert self.step(bounds, opt, 1.0)
        # lr * G / eps / (1 - beta1) = 1e-3 * 1e21 / 1e-8 / 0.1 > 5e30: the pass runs from here on.
        assert not self.step(bounds, opt, 1e21)
        assert not self.step(bounds, opt, 1.0)

    def test_sgds_bound_on_decayed_weights_is_read_again_once_it_has_grown_a_thousandfold(self, monkeypatch):
        from nandoctor.detect import update_bounds
        reads = []
        read = update_bounds._weights_bound
        monkeypatch.setattr(update_bounds, "_weights_bound", lambda opt: reads.append(1) or read(opt))
        params = linear_params(grad=1.0)
        opt, bounds = torch.optim.SGD(params, lr=0.5, momentum=0.9, weight_decay=1.0), UpdateBounds()
        # lr * wd / (1 - mu) = 5: the bound grows about 6x a step, the weights do not.
        proven = [self.step(bounds, opt, 1.0) for _ in range(12)]
        assert all(proven) and 2 <= len(reads) <= 5

    def test_a_state_loaded_mid_run_is_read_again(self):
        params = linear_params(grad=1.0)
        opt, bounds = torch.optim.Adam(params, lr=1e-3), UpdateBounds()
        assert self.step(bounds, opt, 1.0)
        state = opt.state_dict()
        state["state"][0]["exp_avg"].fill_(1e30)  # (a checkpoint whose averages are already huge)
        opt.load_state_dict(state)
        assert not self.step(bounds, opt, 1.0)

    def test_a_non_finite_state_proves_nothing(self):
        params = linear_params(grad=1.0)
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        opt.step()
        opt.state[params[0]]["momentum_buffer"][0, 0] = float("nan")
        bounds = UpdateBounds()
        assert not self.step(bounds, opt, 1.0) and not self.step(bounds, opt, 1.0)

    def test_a_new_parameter_group_is_read_once(self):
        params, extra = linear_params(grad=1.0), torch.nn.Parameter(torch.ones(2))
        extra.grad = torch.ones_like(extra)
        opt, bounds = torch.optim.SGD(params, lr=0.1), UpdateBounds()
        assert self.step(bounds, opt, 1.0)
        opt.add_param_group({"params": [extra]})
        assert not self.step(bounds, opt, 1.0)
        assert self.step(bounds, opt, 1.0)

    def test_a_step_whose_gradients_were_not_measured_is_not_proven(self):
        params = linear_params()
        opt, bounds = torch.optim.SGD(params, lr=0.1), UpdateBounds()
        bounds.gradients_applied(opt, 1.0)
        assert bounds.proven_finite(opt)
        assert not bounds.proven_finite(opt)  # (a second step with no norm read before it)
