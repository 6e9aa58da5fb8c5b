"""Mixed precision with a GradScaler (detect/amp.py): the steps it skips on purpose are
not findings; a scale that collapses, or a loss that is non-finite itself, is."""
from __future__ import annotations

import pytest
import torch

from helpers import detect, read_back
from nandoctor.config import load_config
from nandoctor.detect.observer import NonFiniteFound
from nandoctor.detect.result import StopReason
from nandoctor.detect.watch import StepWatcher


def _amp_training(extra_loss=None, steps: int = 40, init_scale: float = 2.0 ** 30, log_grad_norm: bool = False,
                  step_through_the_scaler: bool = True):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x).float()
            loss = torch.nn.functional.mse_loss(out, y)
            if extra_loss is not None:
                loss = loss + extra_loss(out)
        opt.zero_grad()
        scaler.scale(loss).backward()
        if log_grad_norm:  # the AMP recipe for clipping: unscale, clip, log the norm
            scaler.unscale_(opt)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=False)
            read_back(norm)
        if step_through_the_scaler:
            scaler.step(opt)
        else:  # the bug: the optimizer's own step takes the steps the scaler would skip
            opt.step()
        scaler.update()
        if log_grad_norm:
            read_back(norm)  # (printed after the step it belongs to was skipped)
    return model


def _watch(fn):
    watcher = StepWatcher(load_config().run)
    try:
        with watcher:
            fn()
    except NonFiniteFound:
        return watcher, True
    return watcher, False


def test_steps_the_scaler_skips_while_it_finds_its_scale_are_not_a_finding():
    plain = _amp_training()
    found = detect(_amp_training)
    assert not found.stopped
    amp = found.detector.amp
    assert amp.skipped > 5 and amp.scaler_steps == 40
    assert found.detector.state.step == 40 - amp.skipped  # a skipped step is not an optimizer step
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), _amp_training().parameters()))


def test_a_gradient_norm_the_script_logs_on_a_step_the_scaler_skips_is_not_a_finding():
    plain = _amp_training(log_grad_norm=True)
    found = detect(lambda: _amp_training(log_grad_norm=True))
    assert not found.stopped and found.detector.amp.skipped > 5
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), _amp_training(log_grad_norm=True).parameters()))


def test_near_miss_a_logged_gradient_norm_does_not_hide_a_scale_that_collapses():
    found = detect(lambda: _amp_training(_sqrt_of_zero, log_grad_norm=True))
    assert found.stopped and found.detection.reason is StopReason.AMP_SCALE_COLLAPSE


def test_an_optimizer_step_that_bypasses_the_scaler_is_a_finding_whose_fix_is_scaler_step():
    from nandoctor.diagnose import build_report

    found = detect(lambda: _amp_training(log_grad_norm=True, step_through_the_scaler=False))
    assert found.stopped and found.detection.reason is StopReason.GRADIENT_BEFORE_STEP
    assert found.detection.event.facts.scaled_gradient_stepped
    cause = build_report("t.py", exit_code=3, detection=found.detection).cause
    assert cause.id == "fp16_overflow" and "`scaler.step(optimizer)`" in cause.fix
    assert "running statistics" not in cause.explanation  # not a cast of values float16 cannot hold


def test_watch_mode_lets_the_scaler_skip_steps_too():
    watcher, stopped = _watch(_amp_training)
    assert not stopped and watcher.amp.skipped > 5


def _sqrt_of_zero(out):
    return torch.sqrt((out * 0).clamp(min=0)).mean()  # finite loss, NaN gradient every step


def test_a_scale_that_collapses_below_one_is_a_finding_named_after_the_backward_op():
    found = detect(lambda: _amp_training(_sqrt_of_zero))
    assert found.stopped
    detection = found.detection
    assert detection.reason is StopReason.AMP_SCALE_COLLAPSE
    assert detection.root.backward_node.startswith("SqrtBackward")
    assert detection.root.facts.amp.scale <= 1.0
    assert detection.root.facts.amp.skipped_in_a_row == detection.root.facts.amp.steps


def test_watch_mode_stops_on_a_collapsed_scale_although_no_optimizer_step_ran():
    watcher, stopped = _watch(lambda: _amp_training(_sqrt_of_zero))
    assert stopped and watcher.finding().what == "gradient"


def test_a_loss_that_is_non_finite_once_is_a_step_the_scaler_skips_not_a_finding():
    calls = {"n": 0}

    def one_bad_batch(out):
        calls["n"] += 1
        return torch.log(out * 0).mean() if calls["n"] == 20 else out.sum() * 0

    found = detect(lambda: _amp_training(one_bad_batch))
    assert not found.stopped
    calls["n"] = 0
    watcher, stopped = _watch(lambda: _amp_training(one_bad_batch))
    assert not stopped


@pytest.mark.parametrize("watch", [False, True])
def test_a_loss_that_stays_non_finite_before_scaling_stops_the_run(watch):
    def log_of_zero(out):
        return torch.log(out * 0).mean()

    if watch:
        watcher, stopped = _watch(lambda: _amp_training(log_of_zero))
        assert stopped and watcher.finding().what == "loss" and watcher.finding().step == 0
    else:
        found = detect(lambda: _amp_training(log_of_zero))
        assert found.stopped and found.detection.reason is StopReason.LOSS
        assert found.detection.root.op == "aten.log.default"
        assert found.detection.root.facts.amp.nonfinite_losses_in_a_row == 3
