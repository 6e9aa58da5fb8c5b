"""Watch mode: cheap checks at step boundaries (the loss before each update; the gradients
where asked or where there is no loss), and a replay that localises the op or says the
failure did not come back."""
from __future__ import annotations

from pathlib import Path

import torch

from helpers import run_nandoctor, watch
from nandoctor.config import load_config
from nandoctor.detect.observer import NonFiniteFound
from nandoctor.detect.watch import StepWatcher


def _complex_layer_training(bad_step: int | None):
    """A complex-valued layer (a spectral model's weights) with a real bias; its loss goes
    non-finite at `bad_step` (a zero magnitude divided by)."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 4, dtype=torch.cfloat))
    b = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.Adam([w, b], lr=0.01)
    x = torch.randn(8, 4, dtype=torch.cfloat)

    def train():
        for step in range(4):
            magnitude = (x @ w).abs() * (0.0 if step == bad_step else 1.0)
            loss = ((magnitude + b) / magnitude).mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_([w, b], 1.0)
            opt.step()

    return train


def test_complex_gradients_that_go_non_finite_are_a_finding_not_a_crash():
    # (Their norm is recomputed in float64, which takes the magnitudes of complex values.)
    finding = watch(_complex_layer_training(bad_step=2)).finding()
    assert finding is not None and finding.what == "loss" and finding.step == 2


def test_near_miss_complex_gradients_that_stay_finite_run_clean():
    assert watch(_complex_layer_training(bad_step=None)).finding() is None


def _nan_gradient_at_step_1(watch_gradients: bool = False, assign_gradients: bool = False) -> tuple[StepWatcher, torch.Tensor]:
    """Three SGD steps of a finite loss; step 1's gradient gets a NaN. With
    `assign_gradients` the script writes the gradients itself (no backward, no loss)."""
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = torch.optim.SGD([w], lr=0.1)

    def train():
        for step in range(3):
            opt.zero_grad()
            if assign_gradients:
                w.grad = 2 * w.detach()
            else:
                (w * w).sum().backward()
            if step == 1:
                w.grad[0] = float("nan")
            opt.step()

    watcher = StepWatcher(dict(load_config().run, watch_gradients=watch_gradients))
    try:
        with watcher:
            train()
    except NonFiniteFound:
        pass
    return watcher, w


def test_a_bad_gradient_under_a_finite_loss_shows_in_the_next_steps_loss():
    # The gradients are not read by default: the update carries the NaN into the weights,
    # and the next loss is NaN (the replay finds the op of step 1 either way).
    watcher, w = _nan_gradient_at_step_1()
    finding = watcher.finding()
    assert finding is not None and (finding.what, finding.step) == ("loss", 2)
    assert finding.weights_clean is False and not torch.isfinite(w).all()


def test_watch_gradients_stops_on_a_bad_gradient_before_the_update_is_applied():
    watcher, w = _nan_gradient_at_step_1(watch_gradients=True)
    finding = watcher.finding()
    assert finding is not None and (finding.what, finding.step) == ("gradient", 1)
    assert finding.weights_clean is True and torch.isfinite(w).all()


def test_gradients_written_without_a_loss_are_read_at_the_step():
    # No backward() saw a loss this step: the gradients are all there is to check.
    watcher, w = _nan_gradient_at_step_1(assign_gradients=True)
    finding = watcher.finding()
    assert finding is not None and (finding.what, finding.step) == ("gradient", 1)
    assert finding.weights_clean is True and torch.isfinite(w).all()


def test_near_miss_finite_gradients_written_without_a_loss_run_clean():
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = torch.optim.SGD([w], lr=0.1)
    watcher = StepWatcher(load_config().run)
    with watcher:
        for _ in range(3):
            w.grad = 2 * w.detach()
            opt.step()
    assert watcher.finding() is None and watcher.state.step == 3


def _plateau(val_losses) -> StepWatcher:
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = torch.optim.SGD([w], lr=0.1)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0)

    def train():
        for val_loss in val_losses:
            opt.zero_grad()
            (w * w).sum().backward()
            opt.step()
            scheduler.step(val_loss)

    return watch(train)


def test_a_nan_metric_given_to_a_plateau_scheduler_is_a_finding():
    # A NaN never improves: the scheduler would lower the learning rate over it.
    found = _plateau([0.5, float("nan"), 0.4]).finding()
    assert found is not None and found.what == "monitored metric" and found.step == 2


def test_near_miss_finite_metrics_given_to_the_scheduler_are_no_finding():
    assert _plateau([0.5, torch.tensor(0.45), 0.4]).finding() is None


def _accumulate(bad_micro_batch: int | None, skip_when_bad: bool = False) -> StepWatcher:
    """Two steps of four micro-batches each; one micro-batch's loss is NaN (its gradients too)."""
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = torch.optim.SGD([w], lr=0.1)

    def train():
        for step in range(2):
            opt.zero_grad()
            for micro in range(4):
                scale = float("nan") if (step, micro) == (1, bad_micro_batch) else 1.0
                loss = (w * w).sum() * scale / 4
                loss.backward()
                if skip_when_bad and not torch.isfinite(loss):
                    opt.zero_grad()  # the script throws this micro-batch's gradients away
            opt.step()

    return watch(train)


def test_an_earlier_micro_batchs_nan_loss_is_the_finding_not_only_its_gradients():
    # Under DDP's no_sync() only this rank's loss tells the NaN is its own: the gradients
    # every rank sees after the all-reduce are the same.
    finding = _accumulate(bad_micro_batch=1).finding()
    assert finding is not None and (finding.what, finding.step) == ("loss", 1)


def test_near_miss_a_micro_batch_whose_gradients_the_script_threw_away_is_not_a_finding():
    assert _accumulate(bad_micro_batch=1, skip_when_bad=True).finding() is None


def test_meta_tensors_pass_through_watch_mode():
    # A model built on the meta device has no values: the step is counted, nothing is read.
    watcher = StepWatcher(load_config().run)
    with watcher:
        with torch.device("meta"):
            layer = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(layer.parameters(), lr=0.1)
        layer(torch.randn(2, 4, device="meta")).sum().backward()
        opt.step()
    assert watcher.finding() is None
    assert watcher.state.step == 1
    assert watcher.history().steps == [1] and watcher.history().loss == [None]


def _train_unused_rows(eps: float) -> StepWatcher:
    """Adam on an embedding whose rows 4..7 never get a gradient: with eps=0 their update
    is 0/0, while the loss, which never looks at them, stays finite."""
    torch.manual_seed(0)
    embed = torch.nn.Embedding(8, 3)
    opt = torch.optim.Adam(embed.parameters(), lr=0.01, eps=eps)

    def train():
        for _ in range(3):
            opt.zero_grad()
            embed(torch.tensor([0, 1, 2, 3])).pow(2).mean().backward()
            opt.step()

    watcher = StepWatcher(load_config().run)
    try:
        with watcher:
            train()
            watcher.finish()  # (the check when the script ends)
    except NonFiniteFound:
        pass
    return watcher


def test_parameters_an_optimizer_made_non_finite_unseen_by_the_loss_are_found_at_the_end():
    found = _train_unused_rows(eps=0.0).finding()
    assert found is not None and (found.what, found.step, found.phase) == ("parameters", 3, "optimizer")
    assert found.weights_clean is False


def test_near_miss_the_same_training_with_eps_ends_clean():
    assert _train_unused_rows(eps=1e-8).finding() is None


FLAKY = """\
import os
import torch

torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(64, 3), torch.randn(64, 1)
for step in range(10):
    batch = x.clone()
    if step == 3 and os.path.exists("inject_nan.flag"):
        os.remove("inject_nan.flag")  # a one-off corruption: gone when the run is repeated
        batch[5, 1] = float("nan")
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(batch), y)
    loss.backward()
    opt.step()
torch.save(model.state_dict(), "final.pt")
"""


def test_a_failure_that_does_not_come_back_is_reported_as_not_reproduced(tmp_path, script):
    script("train.py", FLAKY)
    (tmp_path / "inject_nan.flag").write_text("")
    result = run_nandoctor(["run", "--mode", "watch", "train.py"], tmp_path)
    assert result.code == 3
    report = result.report
    assert report["status"] == "nonfinite" and report["mode"] == "watch"
    assert report["reproduced"] is False
    assert report["cause"]["id"] == "nonreproducible"
    assert report["weights_clean"] is True
    assert report["root"]["location"]["line"] == 15  # the loss.backward() that saw it
    assert report["step"] == 3


def test_a_reproducible_failure_is_localised_to_the_op_by_replay(tmp_path, script):
    script("train.py", FLAKY.replace('os.path.exists("inject_nan.flag")', "True").replace(
        '        os.remove("inject_nan.flag")  # a one-off corruption: gone when the run is repeated\n', ""))
    result = run_nandoctor(["run", "--mode", "watch", "train.py"], tmp_path)
    assert result.code == 3
    report = result.report
    assert report["reproduced"] is True and report["mode"] == "watch"
    assert report["root"]["op"].startswith("aten.")
    assert report["root"]["location"]["line"] == 11  # batch[5, 1] = float("nan")
    assert report["cause"]["id"] == "nonfinite_input_data"  # a NaN built from a Python number
    assert report["weights_clean"] is True


def test_the_steps_numbers_read_back_as_float32_whatever_their_dtype():
    # Read one by one on the CPU, the same numbers as the stacked float32 read on a device.
    from nandoctor.detect.watch import _as_floats

    values = [torch.tensor(0.1), torch.tensor(0.1, dtype=torch.float64), torch.tensor(0.1, dtype=torch.bfloat16),
              torch.tensor(float("nan"))]
    read = _as_floats(values)
    assert read[:3] == torch.stack([v.float() for v in values[:3]]).tolist()
    assert read[0] == read[1] != 0.1 and read[2] != read[0] and read[3] != read[3]


def test_a_run_whose_parameters_end_non_finite_is_localised_to_the_optimizer_by_replay(tmp_path):
    sample = Path(__file__).parents[2] / "sample_scripts" / "adam_eps_zero_unused_embedding.py"
    (tmp_path / "train.py").write_text(sample.read_text())
    result = run_nandoctor(["run", "--mode", "watch", "train.py"], tmp_path)
    report = result.report
    assert result.code == 3 and report["mode"] == "watch" and report["reproduced"] is True
    assert report["cause"]["id"] == "optimizer_invalid" and report["root"]["phase"] == "optimizer"
    assert report["weights_clean"] is False
    assert "at the end of the run" in result.stderr


def _average_saved(avg_fn) -> StepWatcher:
    """AveragedModel writes its average through detached aliases, outside any step; the
    script then takes the average's weights out with state_dict() to deploy them."""
    from torch.optim.swa_utils import AveragedModel

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    average = AveragedModel(model, avg_fn=avg_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    watcher = StepWatcher(load_config().run)
    try:
        with watcher:
            for _ in range(3):
                opt.zero_grad()
                model(torch.ones(4, 3)).pow(2).mean().backward()
                opt.step()
                average.update_parameters(model)
            average.module.state_dict()
    except NonFiniteFound:
        pass
    return watcher


def test_non_finite_weights_of_an_average_are_found_when_its_state_dict_is_taken():
    watcher = _average_saved(lambda avg, p, n: avg + (p - avg) / (n - 1))  # n = 1 at the second update
    assert watcher.finding() is not None and watcher.finding().what == "exported"


def test_near_miss_a_finite_average_taken_out_is_clean():
    watcher = _average_saved(lambda avg, p, n: avg + (p - avg) / (n + 1))
    assert watcher.finding() is None


def _finished(watcher: StepWatcher, train) -> StepWatcher:
    """`train()` under `watcher` and the check at the script's end, as `nandoctor run` does."""
    try:
        with watcher:
            train()
            watcher.finish()
    except NonFiniteFound:
        pass
    return watcher


def _forbidden_transition(changed_in_training: bool):
    """A transition matrix built with one -inf entry (a forbidden CRF transition); its
    gradient there is 0, so Adam keeps it. `changed_in_training`: a second -inf appears
    in the weights during training, out of any loss's sight (the row is never used)."""
    torch.manual_seed(0)
    trans = torch.nn.Parameter(0.01 * torch.randn(3, 3))
    with torch.no_grad():
        trans[0, 2] = float("-inf")
    opt = torch.optim.Adam([trans], lr=0.05)

    def train():
        for step in range(3):
            opt.zero_grad()
            torch.logsumexp(trans[:2].flatten(), 0).backward()
            opt.step()
            if changed_in_training and step == 1:
                with torch.no_grad():
                    trans[2, 0] = float("-inf")

    return train


def test_infinities_the_weights_held_before_training_and_still_hold_are_no_finding():
    assert _finished(StepWatcher(load_config().run), _forbidden_transition(False)).finding() is None


def test_near_miss_an_infinity_that_appears_in_the_weights_during_training_is_found_at_the_end():
    finding = _finished(StepWatcher(load_config().run), _forbidden_transition(True)).finding()
    assert finding is not None and finding.what == "parameters"
