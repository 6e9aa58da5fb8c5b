"""The detection model: what stops a run, what is only a suspect, and where the root is."""
from __future__ import annotations

import io
import math

import pytest
import numpy as np
import torch
import torch.nn.functional as F

from helpers import ATAN2_NAN_AT_ORIGIN, ATAN2_REASON, detect, line_in, read_back
from nandoctor.detect.result import StopReason


def line_of(marker: str) -> int:
    """The line number in this file of the line containing `marker`."""
    return line_in(__file__, marker)


class TestForward:
    def test_a_forward_nan_that_is_read_back_stops_with_the_op_that_made_it_as_root(self):
        x = torch.tensor([1.0, -2.0])

        def run():
            y = torch.log(x)  # MARK-log
            print((y * 2).tolist())

        result = detect(run)
        assert result.stopped and result.detection.reason is StopReason.READ_BACK
        root = result.detection.root
        assert root.op == "aten.log.default" and root.phase == "data"  # before training: preparing data
        assert root.location.line == line_of("MARK-log")
        assert root.inputs[0].negatives == 1 and root.output.nan == 1
        assert result.detection.event.op == "aten.mul.Tensor"

    @pytest.mark.parametrize("read", [lambda t: t.sum().item(), lambda t: float(t[1]), lambda t: t.numpy(),
                                      lambda t: repr(t), lambda t: f"{t.sum():.3f}"])
    def test_every_way_of_reading_a_value_back_counts(self, read):
        result = detect(lambda: read(torch.log(torch.tensor([1.0, -2.0]))))
        assert result.stopped and result.detection.reason is StopReason.READ_BACK
        assert result.detection.root.op == "aten.log.default"

    def test_a_nan_that_is_discarded_never_stops_the_run_and_is_counted(self):
        def metric():
            with torch.no_grad():
                p = torch.tensor([0.5, 0.0, 0.5])
                entropy = -torch.where(p > 0, p * torch.log(p), torch.zeros_like(p)).sum()  # MARK-entropy
            return entropy.item()

        result = detect(metric)
        assert not result.stopped
        # Counted where they were born: log(0) = -inf (0 * -inf = NaN downstream is its consequence).
        [born] = result.detector.discarded()
        assert (born.op, born.location.line, born.made, born.count) == \
            ("aten.log.default", line_of("MARK-entropy"), "inf", 1)

    def test_a_stopped_runs_discarded_values_leave_out_the_ones_that_mattered(self):
        def run():
            torch.nan_to_num(torch.log(torch.tensor([-1.0])))  # MARK-thrown-away
            read_back(torch.log(torch.tensor([0.0, 1.0])) * 2)  # MARK-mattered

        found = detect(run)
        assert found.stopped and found.detection.root.location.line == line_of("MARK-mattered")
        assert [(d.op, d.location.line) for d in found.detector.discarded()] == \
            [("aten.log.default", line_of("MARK-thrown-away"))]

    def test_overwriting_only_some_of_the_bad_values_keeps_the_record(self):
        def partly():
            x = torch.log(torch.tensor([-1.0, -2.0, 3.0]))  # MARK-partly
            x[0] = 0.0  # x[1] is still NaN
            read_back(x)

        d = detect(partly).detection
        assert d.root.op == "aten.log.default" and d.root.location.line == line_of("MARK-partly")

    def test_nan_to_num_and_nanmean_discard_what_they_replace(self):
        def impute():
            x = torch.tensor([1.0, float("nan"), 3.0]) * 2
            return torch.nan_to_num(x).sum().item() + x.nanmean().item()

        assert not detect(impute).stopped

    def test_an_inf_alone_is_only_a_suspect(self):
        result = detect(lambda: torch.exp(torch.tensor([1000.0])) * 2)
        assert not result.stopped

    def test_an_inf_that_reaches_the_loss_stops_with_its_birth_as_root(self):
        w = torch.nn.Parameter(torch.tensor([1000.0, 1.0]))

        def train():
            big = torch.exp(w)  # MARK-exp
            loss = (big * 2).sum()
            loss.backward()

        result = detect(train)
        assert result.stopped
        d = result.detection
        assert d.root.op == "aten.exp.default" and d.root.phase == "forward"
        assert d.root.location.line == line_of("MARK-exp")
        assert [s.op for s in d.lineage] == ["aten.exp.default", "aten.mul.Tensor", "aten.sum.default"]

    def test_lineage_goes_from_root_to_symptom(self):
        z = torch.tensor([[1000.0, 0.0]])
        result = detect(lambda: read_back(torch.exp(z) / torch.exp(z).sum(dim=1, keepdim=True)))
        d = result.detection
        assert d.root.op == "aten.exp.default"
        assert d.event.op == "aten.div.Tensor" and d.event.output.nan == 1

    def test_the_root_is_the_earliest_ancestor_not_the_ancestor_of_the_earliest_parent(self):
        # A VAE with a huge log-variance: exp overflows in the forward (the sample is ±Inf,
        # the reconstruction NaN), and again in the KL term, computed before the
        # reconstruction error. The loss's earlier parent is the KL term; its root is the
        # forward's exp.
        logvar = torch.nn.Parameter(torch.full((4, 3), 200.0))
        decoder = torch.nn.Linear(3, 5)

        def train():
            z = torch.exp(0.5 * logvar) * torch.randn(4, 3)  # MARK-vae-sample
            kl = -0.5 * torch.mean(1 + logvar - logvar.exp())  # MARK-vae-kl
            loss = F.mse_loss(decoder(z), torch.zeros(4, 5)) + kl
            loss.backward()

        d = detect(train).detection
        assert d.event.output.nan == 1
        assert d.root.op == "aten.exp.default" and d.root.location.line == line_of("MARK-vae-sample")
        assert [s.location.line for s in d.lineage[:2]] == [line_of("MARK-vae-sample")] * 2
        assert line_of("MARK-vae-kl") not in [s.location.line for s in d.lineage]



class TestFloat16Overflow:
    """A float16 Inf (by default; `run.stop_on_inf_dtypes`) stops the run where an op
    absorbs it into finite values unhandled — the model trains on a saturated value, with
    no NaN to show — at the op that overflowed. A script that handles it (a clamp, as Hugging
    Face's T5 does, `where`, `nan_to_num`, an `isinf` test) runs on; one that lets it reach
    the loss stops there."""

    @staticmethod
    def _half_layer(after):
        torch.manual_seed(0)
        lin = torch.nn.Linear(4, 8).half()
        with torch.no_grad():
            lin.weight[:2] = 6e4  # outlier channels: their outputs overflow float16

        def forward():
            h = lin(torch.randn(16, 4).half())  # MARK-overflow
            return read_back(after(h).float().sum())

        return forward

    @pytest.mark.parametrize("absorb", [torch.sigmoid, torch.relu, torch.tanh])
    def test_an_overflow_absorbed_unhandled_stops_at_the_op_that_overflowed(self, absorb):
        result = detect(self._half_layer(lambda h: absorb(-h.abs())))
        assert result.stopped and result.detection.reason is StopReason.OP_MADE_INF
        root = result.detection.root
        assert root.op == "aten.addmm.default" and root.location.line == line_of("MARK-overflow")

    @pytest.mark.parametrize("handle", [
        lambda h: torch.clamp(h, min=-(torch.finfo(h.dtype).max - 1000), max=torch.finfo(h.dtype).max - 1000),
        lambda h: torch.where(torch.isinf(h), torch.zeros_like(h), h),
        lambda h: torch.nan_to_num(h),
    ])
    def test_near_miss_an_overflow_the_script_clamps_or_replaces_runs_on(self, handle):
        assert not detect(self._half_layer(handle)).stopped

    def test_an_overflow_that_reaches_the_loss_stops_there_rooted_where_it_overflowed(self):
        result = detect(self._half_layer(lambda h: h))
        assert result.stopped and result.detection.reason is StopReason.READ_BACK
        assert result.detection.root.op == "aten.addmm.default"

    def test_an_overflow_never_used_stops_nothing(self):
        assert not detect(lambda: torch.tensor([300.0], dtype=torch.float16) * torch.tensor([300.0],
                                                                                               dtype=torch.float16)).stopped


class TestFloat8:
    """float8 formats store scaled values (FP8 fake quantisation): torch has no `isfinite`
    for them, so they are not checked; a value is checked where it is cast back. A check
    must never raise into the script."""

    @staticmethod
    def _fake_quantised_layer(guard: bool):
        torch.manual_seed(0)
        lin = torch.nn.Linear(4, 2)
        x = torch.cat([torch.randn(3, 4), torch.zeros(1, 4)])  # a zero padding row: amax 0

        def quantised(t):
            with torch.no_grad():
                amax = t.abs().amax(dim=-1, keepdim=True)
                scale = 448.0 / (amax.clamp_min(1e-12) if guard else amax)  # MARK-fp8-scale
                q = (t * scale).to(torch.float8_e4m3fn).to(t.dtype) / scale
            return t + (q - t).detach()

        return lambda: lin(quantised(x)).sum().backward()

    def test_a_zero_scale_through_a_float8_cast_is_found_at_its_division_without_raising(self):
        result = detect(self._fake_quantised_layer(guard=False))
        assert result.stopped and result.detection.root.location.line == line_of("MARK-fp8-scale")

    def test_near_miss_a_guarded_scale_through_a_float8_cast_runs_clean(self):
        assert not detect(self._fake_quantised_layer(guard=True)).stopped


class TestNoFalseAlarms:
    def test_uninitialised_empty_buffers_are_not_checked(self):
        def fill():
            buf = torch.empty(1000)
            buf.fill_(1.0)
            return buf.sum()

        assert not detect(fill).stopped

    def test_a_minus_inf_attention_mask_is_legitimate(self):
        def attend():
            layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
            mask = torch.full((5, 5), float("-inf")).triu(1)
            out = layer(torch.randn(2, 5, 16), src_mask=mask)
            out.sum().backward()

        assert not detect(attend).stopped

    @pytest.mark.skipif(ATAN2_NAN_AT_ORIGIN, reason=ATAN2_REASON)
    def test_inf_masked_inside_backward_formulas_does_not_stop(self):
        def heading():
            v = torch.zeros(4, 2, requires_grad=True)
            torch.atan2(v[:, 1], v[:, 0]).sum().backward()

        assert not detect(heading).stopped

    def test_a_running_maximum_from_minus_inf_is_fine(self):
        def track():
            best = torch.full((), float("-inf"))
            for v in torch.randn(5):
                best = torch.maximum(best, v)

        assert not detect(track).stopped

    def test_meta_tensors_hold_no_values_and_are_not_checked(self):
        def build_on_meta():  # how large models are often initialised before loading weights
            with torch.device("meta"):
                layer = torch.nn.Linear(4, 4)
                mask = torch.full((4,), float("-inf"))
            opt = torch.optim.AdamW(layer.parameters())
            (layer(torch.randn(2, 4, device="meta")) + mask.clamp_min(0)).sum().backward()
            opt.step()

        assert not detect(build_on_meta).stopped

    @staticmethod
    def _skipping_bad_batches(read_to_test: bool, assigned_first: bool = False, threshold: bool = False):
        """Batches whose targets are all padding make a 0/0 loss; the loop reads it."""
        head = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(head.parameters(), lr=0.1)
        printed = []

        def train():
            for step in range(3):
                weight = torch.zeros(4) if step == 1 else torch.ones(4)
                loss = (head(torch.ones(4, 3)).squeeze(1) * weight).sum() / weight.sum()
                if threshold:
                    loss = head(torch.ones(4, 3)).squeeze(1).abs().sum() / weight.sum()  # x/0: Inf
                    value = loss.item()  # a spike guard: an Inf is above any threshold
                    if step > 0 and abs(value) > 100.0:
                        continue
                elif read_to_test and assigned_first:
                    value = loss.item()  # read first, tested on the next line
                    if not math.isfinite(value):
                        continue
                elif read_to_test:
                    if not math.isfinite(loss.item()):
                        continue  # skip the batch: the NaN is discarded on purpose
                else:
                    printed.append(f"{loss.item():.3f}")  # logged: the user sees a NaN loss
                opt.zero_grad()
                loss.backward()
                opt.step()

        return detect(train)

    def test_a_loss_the_script_tested_and_skipped_may_be_printed_later(self):
        # Backward first, then `if not torch.isfinite(loss): zero_grad(); continue`; the
        # epoch's summary prints the last loss, the skipped one's Inf: the script knows of it.
        w = torch.nn.Parameter(torch.tensor([0.5]))
        opt = torch.optim.SGD([w], lr=0.1)

        def train():
            for step in range(3):
                loss = (torch.exp(w * (400.0 if step == 2 else 1.0)) - w).mean()
                loss.backward()
                if not torch.isfinite(loss):
                    opt.zero_grad()
                    continue
                opt.step()
                opt.zero_grad()
            print(f"last loss {loss.item()}")

        assert not detect(train).stopped

    @pytest.mark.parametrize("assigned_first", [False, True])
    def test_a_loss_read_to_test_its_finiteness_and_skipped_is_discarded(self, assigned_first):
        result = self._skipping_bad_batches(read_to_test=True, assigned_first=assigned_first)
        assert not result.stopped and result.detector.state.step == 2

    def test_a_loss_read_and_skipped_above_a_threshold_is_discarded(self):
        result = self._skipping_bad_batches(read_to_test=False, threshold=True)
        assert not result.stopped and result.detector.state.step == 2

    def test_values_read_into_a_function_that_leaves_nan_out_are_read_knowing_it(self):
        import numpy as np

        per_sample = torch.tensor([1.0, 2.0]) / torch.tensor([1.0, 0.0]) - torch.tensor([0.0, float("inf")])
        assert not detect(lambda: print(np.nanmean(per_sample.numpy()))).stopped

    def test_near_miss_the_same_values_read_into_a_plain_mean_stop_the_run(self):
        import numpy as np

        per_sample = torch.tensor([1.0, 2.0]) / torch.tensor([1.0, 0.0]) - torch.tensor([0.0, float("inf")])
        assert detect(lambda: print(np.mean(per_sample.numpy()))).stopped

    def test_near_miss_a_non_finite_loss_read_to_be_logged_stops_the_run_at_its_backward(self):
        result = self._skipping_bad_batches(read_to_test=False)
        assert result.stopped and result.detection.reason is StopReason.LOSS
        assert result.detection.root.op == "aten.div.Tensor"

    @staticmethod
    def _skipping_bad_updates(skip: bool, guard: str):
        """A corrupted record (an Inf feature) makes one step's loss and gradients NaN after
        backward; the loop skips that update, as fairseq and HF guard theirs, and says so."""
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def train():
            for step in range(4):
                x = torch.ones(8, 3)
                if step == 2:
                    x[1, 1] = float("inf")  # a corrupted record in the stream
                loss = ((model(x) - 1) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                if guard == "norm":
                    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    if skip and not math.isfinite(norm.item()):
                        print(f"step {step}: grad norm {norm.item()}, skipping the update")
                        opt.zero_grad()
                        continue
                elif skip and not all(torch.isfinite(p.grad).all() for p in model.parameters()):
                    opt.zero_grad()
                    continue
                opt.step()

        return detect(train)

    @pytest.mark.parametrize("guard", ["norm", "gradients"])
    def test_a_non_finite_loss_and_gradients_whose_update_is_skipped_are_discarded(self, guard, capsys):
        """They matter where the step would apply them (watch mode sees the same); the
        message the guard prints, under its test, is a read on the way to discarding."""
        result = self._skipping_bad_updates(skip=True, guard=guard)
        assert not result.stopped and result.detector.state.step == 3

    @pytest.mark.parametrize("guard", ["norm", "gradients"])
    def test_near_miss_the_same_update_applied_stops_before_the_step(self, guard):
        result = self._skipping_bad_updates(skip=False, guard=guard)
        assert result.stopped and result.detector.state.step == 2
        assert result.detection.reason is StopReason.LOSS

    def test_a_sum_that_overflows_is_rechecked_exactly(self):
        big = torch.full((10,), 3e38)
        assert not detect(lambda: big * 1.0).stopped


class TestMetricsTheScriptPrints:
    """A value computed without autograd, outside the model, once training began — a
    validation metric, a best-so-far ratio — trains nothing: printed or logged non-finite,
    it is listed as made, not a stop (as in watch mode). The model's own NaN, and the loss,
    still stop the run: when read, or (the loss) at its backward."""

    @staticmethod
    def _train_then_evaluate(metric, model=None):
        model = model or torch.nn.Linear(3, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(8, 3), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])

        def run():
            for _ in range(2):
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
            with torch.no_grad():
                read_back(metric(model(x), y))

        return detect(run)

    @staticmethod
    def _per_class_precision(logits, y):
        pred = logits.argmax(1)
        tp = torch.stack([((pred == c) & (y == c)).sum() for c in range(5)]).float()
        predicted = torch.stack([(pred == c).sum() for c in range(5)]).float()
        return tp / predicted  # a fifth class the 4 outputs never predict: 0/0

    def test_a_validation_metric_of_zero_over_zero_printed_is_no_stop(self):
        result = self._train_then_evaluate(self._per_class_precision)
        assert not result.stopped
        assert [d.op for d in result.detector.recorder.discarded()] == ["aten.div.Tensor"]

    def test_a_metric_module_with_no_parameters_is_no_model(self):
        # torchmetrics' metrics are nn.Modules called on their own: what they make is a metric.
        class Precision(torch.nn.Module):
            def forward(self, logits, y):
                return TestMetricsTheScriptPrints._per_class_precision(logits, y)

        result = self._train_then_evaluate(Precision())
        assert not result.stopped
        assert [d.op for d in result.detector.recorder.discarded()] == ["aten.div.Tensor"]

    def test_near_miss_the_models_own_nan_in_evaluation_still_stops(self):
        class LogHead(torch.nn.Module):
            def forward(self, x):
                return torch.log(x - 10.0)  # negative for every input

        result = self._train_then_evaluate(lambda logits, y: logits.mean(), torch.nn.Sequential(
            torch.nn.Linear(3, 4), LogHead()))
        assert result.stopped and result.detection.root.op == "aten.log.default"

    @staticmethod
    def _mape_logged(backpropagated: bool):
        """A MAPE of the live predictions (not detached) over targets that hold 0: +Inf.
        Logged after the step as demand forecasts log it, or made the loss."""
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(8, 3), torch.tensor([0.0, 1.0, 2.0, 3.0] * 2)

        def run():
            for _ in range(2):
                pred = F.softplus(model(x)).squeeze(-1)
                mape = ((pred - y).abs() / y.abs()).mean() * 100  # MARK-mape
                loss = mape if backpropagated else F.mse_loss(pred, y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                print(f"mape {mape.item():.2f}%")

        return detect(run)

    def test_a_metric_of_the_live_predictions_logged_without_detach_trains_nothing(self):
        result = self._mape_logged(backpropagated=False)
        assert not result.stopped
        assert [d.op for d in result.detector.recorder.discarded()][:1] == ["aten.div.Tensor"]

    def test_near_miss_the_same_metric_made_the_loss_stops_at_its_backward(self):
        result = self._mape_logged(backpropagated=True)
        assert result.stopped and result.detection.reason is StopReason.LOSS
        root = result.detection.root
        assert root.op == "aten.div.Tensor" and root.location.line == line_of("MARK-mape")

    def test_near_miss_the_loss_read_back_before_its_backward_stops_there_with_the_same_root(self):
        w = torch.nn.Parameter(torch.tensor([-1.0]))

        def run():
            opt = torch.optim.SGD([w], lr=0.1)
            loss = torch.log(w).sum()
            print(f"loss {loss.item()}")
            loss.backward()
            opt.step()

        result = detect(run)
        assert result.stopped and result.detection.reason is StopReason.LOSS
        assert result.detection.root.op == "aten.log.default"

    def test_a_nan_metric_the_learning_rate_follows_is_a_finding_rooted_where_it_was_made(self):
        model = torch.nn.Linear(3, 4)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(torch.optim.SGD(model.parameters(), lr=0.1))

        def plateau(logits, y):
            precision = self._per_class_precision(logits, y)
            scheduler.step(precision.mean().item())  # a NaN never improves: the rate drops
            return precision

        result = self._train_then_evaluate(plateau, model)
        assert result.stopped and result.detection.reason is StopReason.MONITORED_METRIC
        assert result.detection.root.op == "aten.div.Tensor"

    @staticmethod
    def _trained_with_schedule(lr_at):
        """Five SGD steps at the learning rate `lr_at(it)`, a schedule written for three."""
        w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
        opt = torch.optim.SGD([w], lr=0.1)

        def run():
            for it in range(5):
                opt.param_groups[0]["lr"] = lr_at(it)
                opt.zero_grad()
                (w * w).sum().backward()
                opt.step()

        return detect(run)

    @staticmethod
    def _torch_poly(clamped: bool):
        def lr_at(it):
            progress = torch.tensor(it / 3)
            lr = 0.1 * ((1 - progress).clamp(min=0) if clamped else 1 - progress) ** 0.9  # MARK-poly
            return lr.item()

        return lr_at

    @staticmethod
    def _numpy_poly(clamped: bool):
        def lr_at(it):
            progress = max(0.0, 1 - it / 3) if clamped else 1 - it / 3
            return 0.1 * np.power(progress, 0.9)  # MARK-numpy-poly

        return lr_at

    def test_a_learning_rate_schedule_that_runs_past_its_end_is_found_where_it_went_nan(self):
        result = self._trained_with_schedule(self._torch_poly(clamped=False))
        assert result.stopped and result.detection.reason is StopReason.OPTIMIZER_SETTING
        assert result.detection.root.op == "aten.pow.Tensor_Scalar"
        assert result.detection.root.location.line == line_of("MARK-poly")

    def test_near_miss_a_schedule_clamped_at_its_end_is_clean(self):
        assert not self._trained_with_schedule(self._torch_poly(clamped=True)).stopped

    def test_a_schedule_numpy_made_nan_is_found_at_the_line_numpy_warned_at(self):
        result = self._trained_with_schedule(self._numpy_poly(clamped=False))
        assert result.stopped and result.detection.reason is StopReason.OPTIMIZER_SETTING
        root = result.detection.root
        assert root.location.line == line_of("MARK-numpy-poly") and root.step == 4
        assert root.facts.optimizer_setting == "lr" and "invalid value" in root.facts.made_by_numpy

    def test_near_miss_a_numpy_schedule_clamped_at_its_end_is_clean(self):
        assert not self._trained_with_schedule(self._numpy_poly(clamped=True)).stopped

    def test_a_metrics_state_that_nothing_trains_may_hold_the_inf_of_a_metric(self):
        # Keras keeps a metric's running total in a variable nothing trains.
        total = torch.nn.Parameter(torch.zeros(()), requires_grad=False)

        def mape(logits, y):
            with torch.no_grad():
                total.add_((logits[:, 0] / (y * 0.0)).abs().mean())
            return total

        assert not self._train_then_evaluate(mape).stopped


class TestBackward:
    def test_a_backward_nan_is_reported_at_the_forward_line(self):
        p = torch.nn.Parameter(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        target = torch.tensor([[1.0, 2.0], [0.0, 0.0]])

        def train():
            dist = torch.sqrt(((p - target) ** 2).sum(dim=1))  # MARK-sqrt
            dist.mean().backward()

        d = detect(train).detection
        assert d.root.phase == "backward" and d.root.backward_node == "SqrtBackward0"
        assert d.root.location.line == line_of("MARK-sqrt")

    def test_a_masked_division_is_traced_to_the_forward_division(self):
        lin = torch.nn.Linear(3, 1)
        x, target = torch.randn(8, 3), torch.tensor([1.0, 0.0] * 4)

        def train():
            rel = (lin(x).squeeze(1) - target) / target  # MARK-div
            rel[target != 0].abs().mean().backward()

        d = detect(train).detection
        assert d.root.op == "aten.div.Tensor" and d.root.phase == "forward"
        assert d.root.location.line == line_of("MARK-div")
        assert d.root.facts.gradient_leak_through == "DivBackward0"

    def test_an_inf_that_exp_maps_to_zero_is_a_masked_leak_from_where_it_was_made(self):
        # exp(w * log r) with r = 0: exp(-inf) = 0 keeps the forward finite, as a `where`
        # would; backward's 0 * -inf is NaN. The root is the log, not the product's backward.
        ratings = torch.tensor([[2.0, 0.0, 3.0]])
        w = torch.nn.Parameter(torch.full((1, 3), 1 / 3))

        def train():
            log_r = torch.log(ratings)  # MARK-absorbed-log
            torch.exp((w * log_r).sum(-1)).sum().backward()

        d = detect(train).detection
        assert d.root.op == "aten.log.default" and d.root.location.line == line_of("MARK-absorbed-log")
        assert d.root.facts.gradient_leak_through == "MulBackward0"

    def test_an_inf_that_exp_maps_to_zero_with_nothing_behind_it_stops_nothing(self):
        # The healthy twin: log-space weights with a -inf for an excluded item, no gradient
        # through the product with the Inf (the weights are constants).
        logits = torch.nn.Parameter(torch.zeros(3))
        log_prior = torch.log(torch.tensor([0.5, 0.0, 0.5]))
        assert not detect(lambda: (torch.exp(log_prior) * logits).sum().backward()).stopped

    def test_a_nan_made_from_a_mask_and_dropped_by_where_is_a_leak_at_its_product(self):
        # A policy's entropy over legal moves: p * log_softmax(masked) is 0 * -inf = NaN at
        # illegal moves, dropped by the where; backward's 0 * -inf is NaN all the same.
        legal = torch.tensor([[True, False, True]])
        w = torch.nn.Parameter(torch.zeros(1, 3))

        def train():
            logp = torch.log_softmax(w.masked_fill(~legal, float("-inf")), -1)
            entropy = -torch.where(legal, logp.exp() * logp, torch.zeros(1, 3)).sum()  # MARK-legal-entropy
            entropy.backward()

        d = detect(train).detection
        assert d.root.op == "aten.mul.Tensor" and d.root.phase == "forward"
        assert d.root.location.line == line_of("MARK-legal-entropy")
        assert d.root.facts.gradient_leak_through == "MulBackward0"

    def test_near_miss_the_entropy_with_the_mask_replaced_before_the_product_is_clean(self):
        legal = torch.tensor([[True, False, True]])
        w = torch.nn.Parameter(torch.zeros(1, 3))

        def train():
            logp = torch.log_softmax(w.masked_fill(~legal, float("-inf")), -1)
            safe = torch.where(legal, logp, torch.zeros(1, 3))
            (-(safe.exp() * safe).sum()).backward()

        assert not detect(train).stopped

    def test_an_inputs_gradient_nothing_reads_does_not_stop_a_run_that_trains_parameters(self):
        # Forces as -dE/dpos with create_graph: the second backward leaves NaN in pos.grad
        # (the norm's double backward at a zero distance), which the script never reads.
        w = torch.nn.Parameter(torch.ones(1))

        def train():
            opt = torch.optim.SGD([w], lr=0.1)
            pos = torch.zeros(2, 3).requires_grad_(True)
            energy = (w * torch.linalg.vector_norm(pos[0] - pos[1])).sum()
            forces = -torch.autograd.grad(energy, pos, create_graph=True)[0]
            opt.zero_grad()
            (energy + forces.pow(2).sum()).backward()
            opt.step()

        result = detect(train)
        assert not result.stopped and torch.isfinite(w).all()

    def test_near_miss_a_parameters_gradient_left_non_finite_stops(self):
        w = torch.nn.Parameter(torch.zeros(3))

        def train():
            opt = torch.optim.SGD([w], lr=0.1)
            opt.zero_grad()
            torch.sqrt(w).sum().backward()  # sqrt'(0) = inf into w.grad
            opt.step()

        assert detect(train).stopped

    def test_a_gradient_made_non_finite_stops_before_the_optimizer_step(self):
        w = torch.nn.Parameter(torch.tensor([1.0]))
        opt = torch.optim.SGD([w], lr=0.1)

        def train():
            (w * 2).sum().backward()
            w.grad.fill_(float("nan"))
            opt.step()

        result = detect(train)
        assert result.stopped
        assert torch.isfinite(w).all(), "the bad update must not have been applied"


class TestReentrantCheckpointing:
    """`checkpoint(..., use_reentrant=True)` runs the forward again inside backward: the
    nodes built there get the user's forward line, as the first forward's would."""

    @pytest.mark.parametrize("by_node", [True, False])
    def test_a_sqrt_at_zero_recomputed_in_backward_is_reported_at_its_forward_line(self, by_node):
        from torch.utils.checkpoint import checkpoint

        class Radius(torch.nn.Module):
            def forward(self, x):
                return (x * x).sum(-1, keepdim=True).sqrt()  # MARK-recomputed

        def train():
            points = torch.nn.Parameter(torch.cat([torch.ones(2, 3), torch.zeros(2, 3)]))  # padding at 0
            checkpoint(Radius(), points * 1.0, use_reentrant=True).sum().backward()

        d = detect(train, backward_by_node=by_node).detection
        assert d.root.backward_node == "SqrtBackward0" and d.root.location.line == line_of("MARK-recomputed")


class TestComplexValues:
    """Gradients through a spectrum are complex: a non-finite one keeps its record on the
    way, so backward op by op (the replay's) and node by node find the same root."""

    @staticmethod
    def _magnitude(safe: bool):
        def spectrum():
            gain = torch.nn.Parameter(torch.ones(64))
            audio = torch.cat([torch.zeros(32), torch.linspace(-1, 1, 32)])  # leading silence
            spec = torch.stft(audio * gain, 16, hop_length=4, window=torch.hann_window(16), return_complex=True)
            mag = spec.abs() if safe else torch.sqrt(spec.real ** 2 + spec.imag ** 2)  # sqrt(0) in the silence
            mag.mean().backward()

        return spectrum

    @pytest.mark.parametrize("by_node", [True, False])
    def test_a_sqrt_of_a_silent_spectrum_is_rooted_at_its_backward_either_way(self, by_node):
        d = detect(self._magnitude(safe=False), backward_by_node=by_node).detection
        assert d.root.backward_node == "SqrtBackward0" and d.root.op == "aten.div.Tensor"

    @pytest.mark.parametrize("by_node", [True, False])
    def test_near_miss_the_complex_abs_of_a_silent_spectrum_is_clean(self, by_node):
        assert not detect(self._magnitude(safe=True), backward_by_node=by_node).stopped


class TestSetupPhases:
    """Before training, setting up the model is init; everything else prepares data."""

    def test_an_op_inside_a_module_init_is_init(self):
        class Scaled(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.scale = torch.nn.Parameter(torch.log(torch.tensor([-1.0])))  # MARK-init-log
                read_back(self.scale)

        d = detect(Scaled).detection
        assert d.root.op == "aten.log.default" and d.root.phase == "init"

    @staticmethod
    def _noisy(noise_init: float):
        """A learned noise level parametrised through softplus, initialised by its inverse
        (GPyTorch's `inv_softplus`): at 0 the parameter is -inf, softplus(-inf) is 0."""
        class Noisy(torch.nn.Module):
            def __init__(self):
                super().__init__()
                x = torch.tensor(noise_init)
                self.raw = torch.nn.Parameter(x + torch.log(-torch.expm1(-x)))  # MARK-inv-softplus

            def forward(self, y):
                var = F.softplus(self.raw) ** 2
                return (0.5 * torch.log(var) + y ** 2 / (2 * var)).mean()  # MARK-nll

        return Noisy()

    def test_a_parameter_built_infinite_and_made_finite_by_softplus_is_the_root_of_what_follows(self):
        d = detect(lambda: self._noisy(0.0)(torch.randn(8)).backward()).detection
        assert d.root.op == "aten.log.default" and d.root.phase == "init"
        assert d.root.location.line == line_of("MARK-inv-softplus")
        assert any(site.location.line == line_of("MARK-nll") for site in d.lineage)

    def test_near_miss_a_finite_initial_noise_trains(self):
        assert not detect(lambda: self._noisy(0.1)(torch.randn(8)).backward()).stopped

    def test_near_miss_a_value_born_apart_from_the_infinite_parameter_has_its_own_root(self):
        def run():
            model = self._noisy(0.0)
            F.softplus(model.raw)  # absorbed: the parameter is known to be -inf
            x = torch.tensor([1.0, 0.0], requires_grad=True)
            torch.log(x * 1).sum().backward()  # MARK-own-log

        d = detect(run).detection
        assert d.root.location.line == line_of("MARK-own-log") and d.root.phase != "init"

    def test_weights_initialised_from_data_are_init(self):
        # Class prototypes as a classifier's rows; class 2 is absent from the calibration set.
        def build():
            model = torch.nn.Linear(4, 3, bias=False)
            x, y = torch.randn(6, 4), torch.tensor([0, 1, 0, 1, 0, 1])
            with torch.no_grad():
                protos = torch.stack([x[y == c].mean(0) for c in range(3)])  # MARK-protos
                model.weight.copy_(protos)

        root = detect(build).detection.root
        assert root.phase == "init" and root.location.line == line_of("MARK-protos")

    def test_near_miss_the_same_means_kept_as_data_are_data(self):
        def prepare():
            torch.nn.Linear(4, 3, bias=False)
            x, y = torch.randn(6, 4), torch.tensor([0, 1, 0, 1, 0, 1])
            read_back(torch.stack([x[y == c].mean(0) for c in range(3)]))

        assert detect(prepare).detection.root.phase == "data"

    def test_a_dataset_built_after_the_optimizer_still_prepares_data(self):
        class Scaled(torch.utils.data.Dataset):
            def __init__(self):
                raw = torch.ones(6, 2)
                self.x = raw / (raw.max() - raw.min())  # a constant dataset: 0/0

        def train():
            torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)  # training has started
            read_back(Scaled().x)

        d = detect(train).detection
        assert d.root.op == "aten.div.Tensor" and d.root.phase == "data"

    def test_data_prepared_after_the_optimizer_but_before_the_model_ran_is_data(self):
        # A Trainer that builds its optimizer in __init__ and its data in prepare().
        def train():
            torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
            raw = torch.ones(6, 2)
            read_back(raw / (raw.max() - raw.min()))

        assert detect(train).detection.root.phase == "data"

    def test_near_miss_targets_encoded_in_the_training_loop_before_the_model_ran_are_forward(self):
        model = torch.nn.Linear(2, 1)

        def train():
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(1):
                widths = torch.tensor([0.0, 32.0]) * 1
                targets = torch.log(widths / 32.0)  # step 0's targets, before its forward
                (model(torch.ones(2, 2)).squeeze(1) - targets).pow(2).sum().backward()
                opt.step()

        assert detect(train).detection.root.phase == "forward"

    def test_near_miss_the_same_division_in_the_loop_once_the_model_ran_is_forward(self):
        def train():
            model = torch.nn.Linear(2, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            model(torch.ones(1, 2))  # the first step's forward
            raw = torch.ones(6, 2)
            model(raw / (raw.max() - raw.min())).sum().backward()
            opt.step()

        root = detect(train).detection.root
        assert root.op == "aten.div.Tensor" and root.phase == "forward"

    def test_a_value_entering_torch_non_finite_in_the_loop_is_data(self):
        import numpy as np

        def train():
            model = torch.nn.Linear(2, 1)
            torch.optim.SGD(model.parameters(), lr=0.1)
            model(torch.ones(1, 2))
            targets = torch.from_numpy(np.array([1.0, np.nan], dtype=np.float32))  # MARK-entered
            read_back(targets * 2)

        root = detect(train).detection.root
        assert root.phase == "data" and root.location.line == line_of("MARK-entered")

    def test_an_op_on_a_parameter_before_training_is_init(self):
        w = torch.nn.Parameter(torch.ones(2))

        def init():
            with torch.no_grad():
                w.div_(0)  # writes the parameter: stops at once

        d = detect(init).detection
        assert d.root.phase == "init" and d.reason is StopReason.PARAMETER_WRITTEN

    def test_a_value_entering_torch_non_finite_is_rooted_where_it_entered(self):
        import numpy as np

        def prepare():
            x = torch.from_numpy(np.array([1.0, np.nan], dtype=np.float32))  # MARK-entry
            read_back(x * 2)

        d = detect(prepare).detection
        # (from_numpy lifts the array through aten.lift_fresh; as_tensor may share memory and run no op)
        assert d.root.op in ("", "aten.lift_fresh.default")
        assert d.root.phase == "data" and d.root.facts.untracked_input
        assert d.root.location.line == line_of("MARK-entry")

    def test_a_nan_through_torch_save_and_load_keeps_its_root(self):
        import io

        def cache():
            mask = torch.zeros(4)
            normalised = mask / mask.max()  # MARK-cache
            buffer = io.BytesIO()
            torch.save({"masks": normalised}, buffer)
            buffer.seek(0)
            read_back(torch.load(buffer)["masks"] + 1)

        d = detect(cache).detection
        assert d.root.op == "aten.div.Tensor" and d.root.location.line == line_of("MARK-cache")


class TestWeightsTakenOut:
    """A value made by accident that a model's state holds (written through a detached
    alias, as averages are) matters once the script takes the state out."""

    @staticmethod
    def _average(avg_fn):
        from torch.optim.swa_utils import AveragedModel

        model = torch.nn.Linear(3, 2)
        average = AveragedModel(model, avg_fn=avg_fn)

        def train():
            for _ in range(3):
                average.update_parameters(model)
            return average.module.state_dict()

        return detect(train)

    def test_an_average_holding_a_nan_it_made_stops_where_its_state_is_taken(self):
        result = self._average(lambda avg, p, n: avg + (p - avg) / (n - 1))  # MARK-average
        d = result.detection
        assert d.reason is StopReason.STATE_EXPORTED and d.event.facts.parameter.name in ("weight", "bias")
        assert d.root.op == "aten.div.Tensor" and d.root.location.line == line_of("MARK-average")

    def test_near_miss_a_finite_average_is_clean(self):
        assert not self._average(lambda avg, p, n: avg + (p - avg) / (n + 1)).stopped

    def test_near_miss_a_minus_inf_sentinel_buffer_in_a_state_is_clean(self):
        class Tracker(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("best", torch.full((3,), float("-inf")))  # a running max, not yet seen

        def export():
            tracker = Tracker()
            tracker.best[:2] = torch.maximum(tracker.best[:2], torch.tensor([1.0, 2.0]))  # best[2] never seen
            return tracker.state_dict()

        assert not detect(export).stopped

    EDGES = [float("-inf"), 13.0, 20.0, 30.0, float("inf")]  # typed away from the line that builds the tensor

    @classmethod
    def _checkpointed(cls, buffer_of):
        """A model built with a buffer (`buffer_of()`, at init), trained two steps, its state
        saved and loaded back into a new one, as a best-checkpoint loop does."""
        import io

        class Head(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(2, 3)
                self.register_buffer("table", buffer_of())

            def forward(self, x):
                return self.linear(x) + self.table[:3].clamp(min=-1e4, max=1e4)

        def run():
            model = Head()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(2):
                loss = model(torch.randn(4, 2)).logsumexp(1).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            saved = io.BytesIO()
            torch.save(model.state_dict(), saved)
            saved.seek(0)
            Head().load_state_dict(torch.load(saved))

        return detect(run)

    def test_bin_edges_open_at_their_ends_are_a_constant_saved_and_loaded_back(self):
        assert not self._checkpointed(lambda: torch.tensor(self.EDGES)).stopped

    def test_a_log_prior_built_at_init_and_trained_with_is_a_constant_saved_and_loaded_back(self):
        # log of a class prior with classes never seen: -inf, which the model trained with.
        assert not self._checkpointed(lambda: torch.log(torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0]))).stopped

    @staticmethod
    def _best_state_put_back(corrupt: bool):
        """A log-prior buffer with -inf for classes never seen; the best state kept with
        copy.deepcopy and loaded back into the same model (or, `corrupt`, with a NaN in it)."""
        import copy

        class Adjusted(torch.nn.Linear):
            def __init__(self):
                super().__init__(2, 3)
                self.register_buffer("log_prior", torch.log(torch.tensor([0.5, 0.5, 0.0])))

        def run():
            model = Adjusted()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(2):
                loss = (model(torch.randn(4, 2)) + model.log_prior).logsumexp(1).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            best = copy.deepcopy(model.state_dict())
            if corrupt:
                best["log_prior"][0] = float("nan")
            model.load_state_dict(best)

        return detect(run)

    def test_a_best_state_deep_copied_and_put_back_keeps_its_constant(self):
        assert not self._best_state_put_back(corrupt=False).stopped

    def test_near_miss_a_best_state_put_back_with_a_new_nan_in_a_buffer_stops(self):
        result = self._best_state_put_back(corrupt=True)
        assert result.stopped and result.detection.event.facts.parameter.name == "log_prior"

    def test_near_miss_a_row_of_data_with_an_infinity_in_its_middle_is_data_not_bounds(self):
        from nandoctor.detect.recorder import _open_bounds

        assert _open_bounds(torch.tensor(self.EDGES)) and _open_bounds(torch.tensor([0.0, 1.0, float("inf")]))
        assert not _open_bounds(torch.tensor([1.0, float("inf"), 3.0, 4.0]))  # (a reading that overflowed)
        assert not _open_bounds(torch.tensor([float("inf"), 1.0, 2.0]))  # (+inf first: not sorted)
        assert not _open_bounds(torch.tensor([float("-inf"), float("nan"), 2.0]))


class TestUserCodeInsideBackward:
    """Code the user wrote that autograd runs (a custom Function's backward, hooks) is
    reported at its own line, judged as the op it is."""

    def test_a_custom_function_backward_is_reported_at_its_own_line(self):
        class ZeroOverZero(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.sum(0, keepdim=True)

            @staticmethod
            def backward(ctx, grad):
                g = grad.clone().expand(3, -1)
                g[0] = 0
                g[0] /= 0  # MARK-custom-div
                return g

        w = torch.nn.Parameter(torch.ones(3, 2))
        d = detect(lambda: ZeroOverZero.apply(w * 2).sum().backward()).detection
        assert d.root.op == "aten.div_.Tensor" and d.root.backward_node == "ZeroOverZeroBackward"
        assert d.root.location.line == line_of("MARK-custom-div")
        assert d.root.facts.user_backward

    def test_a_tensor_hook_is_reported_at_its_own_line(self):
        w = torch.nn.Parameter(torch.ones(2))

        def train():
            y = w * 3
            y.register_hook(lambda g: (g - 1).log())  # MARK-hook
            y.sum().backward()

        d = detect(train).detection
        assert d is not None and d.root.location.line == line_of("MARK-hook")

    def test_a_module_backward_hook_is_reported_at_its_own_line(self):
        layer = torch.nn.Linear(3, 2)
        layer.register_full_backward_hook(
            lambda module, grad_in, grad_out: (grad_in[0] / grad_in[0].abs().sum(),))  # MARK-module-hook

        def train():
            x = torch.zeros(4, 3, requires_grad=True)
            (layer(x) * 0).sum().backward()

        d = detect(train).detection
        assert d.root.op == "aten.div.Tensor" and d.root.facts.user_backward
        assert d.root.location.line == line_of("MARK-module-hook")

    def test_double_backward_reports_the_line_of_the_penalty(self):
        w = torch.nn.Parameter(torch.tensor([0.0, 1.0]))

        def gradient_penalty():
            (g,) = torch.autograd.grad((w ** 3).sum(), w, create_graph=True)
            torch.sqrt(g).sum().backward()  # MARK-penalty

        d = detect(gradient_penalty).detection
        assert d.root.backward_node == "SqrtBackward0" and d.root.location.line == line_of("MARK-penalty")

    def test_a_builtin_backward_formula_keeps_the_forward_line(self):
        p = torch.nn.Parameter(torch.zeros(2))
        d = detect(lambda: torch.sqrt(p * 1).sum().backward()).detection  # MARK-builtin
        assert d.root.backward_node == "SqrtBackward0" and not d.root.facts.user_backward
        assert d.root.location.line == line_of("MARK-builtin")


class TestInPlaceOps:
    def test_an_in_place_op_shows_its_inputs_as_they_were_before_it(self):
        def zero_over_zero():
            x = torch.ones(3, 2)
            x[0] = 0
            x[0] /= 0
            read_back(x)

        root = detect(zero_over_zero).detection.root
        names = {s.name: s for s in root.inputs}
        assert root.op == "aten.div_.Tensor"
        assert names["self"].zeros == 2 and names["self"].nan == 0  # before the op, not after
        assert names["other"].zeros == 1 and names["other"].shape == ()  # the Python number 0
        assert not root.facts.untracked_input

    def test_an_in_place_op_on_an_input_that_was_already_bad_keeps_its_lineage(self):
        def twice():
            x = torch.tensor([1.0, -1.0])
            y = x.log()  # MARK-log-first
            y.mul_(2)
            read_back(y)

        d = detect(twice).detection
        assert d.root.op == "aten.log.default" and d.root.location.line == line_of("MARK-log-first")


class TestSlicesOfOneTensor:
    """Two slices of one tensor written in place separately each keep their own record: a
    later bad write to the validation rows is not what reached the training forward."""

    @staticmethod
    def _standardise_in_place(train_constant: bool):
        data = torch.randn(10, 2)
        data[:6, 1] = 3.0 if train_constant else data[:6, 1]
        train, val = data[:6], data[6:]
        model = torch.nn.Linear(2, 1)

        def prepare_and_train():
            sd = train[:, 1].std()
            train[:, 1] -= train[:, 1].mean()
            train[:, 1] /= sd  # MARK-train-slice
            val[:, 1] /= sd * 0  # MARK-val-slice
            model(train).sum().backward()

        return detect(prepare_and_train)

    def test_the_training_slice_is_the_root_not_a_later_write_to_the_validation_slice(self):
        result = self._standardise_in_place(train_constant=True)
        assert result.stopped and "MARK-train-slice" in result.detection.root.location.code

    def test_near_miss_a_bad_validation_slice_alone_never_reaches_training(self):
        result = self._standardise_in_place(train_constant=False)
        assert not result.stopped
        assert [d.location.line for d in result.detector.discarded()] == [line_of("MARK-val-slice")]


class TestPhasesAndSteps:
    def test_optimizer_steps_are_counted_and_history_kept(self):
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def train():
            for penalty in (0.0, 0.0, 0.0, -1.0):
                opt.zero_grad()
                loss = F.mse_loss(model(torch.ones(4, 2)), torch.zeros(4, 1))
                (loss + torch.log(torch.tensor([1.0 + penalty])).sum()).backward()
                opt.step()

        result = detect(train)
        assert result.detector.state.step == 3
        assert result.detection.root.step == 3
        assert len(result.detector.history().loss) == 3

    @staticmethod
    def _after_backward(work_on_gradient: bool):
        emb = torch.nn.Embedding(6, 2)
        opt = torch.optim.SGD(emb.parameters(), lr=0.1)

        def train():
            loss = emb(torch.tensor([1, 2])).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            g = emb.weight.grad
            if work_on_gradient:
                g.div_(g.norm(dim=1, keepdim=True))  # rows never looked up: 0/0
            else:
                read_back(loss.detach() / torch.zeros(1))  # a metric, after backward
            opt.step()

        return detect(train)

    def test_work_on_a_gradient_between_backward_and_the_step_is_phase_backward(self):
        root = self._after_backward(work_on_gradient=True).detection.root
        assert root.op == "aten.div_.Tensor" and root.phase == "backward" and root.backward_node is None

    def test_near_miss_a_metric_computed_after_backward_is_still_forward_and_printed_it_trains_nothing(self):
        result = self._after_backward(work_on_gradient=False)
        assert not result.stopped and result.detector.recorder.latest_birth().phase == "forward"

    def test_the_scalar_a_gradient_normalisation_divides_by_is_backward_too(self):
        # `p.grad.mul_(1 / p.grad.norm())`: the Inf is born in the reciprocal, an op on a
        # norm (not itself a gradient) that only feeds the gradient's write.
        head = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(head.parameters(), lr=0.1)

        def train():
            loss = head(torch.ones(3, 2)).sum() * 0.0  # a head whose loss weight is still 0
            opt.zero_grad()
            loss.backward()
            for p in head.parameters():
                p.grad.mul_(1.0 / p.grad.norm())
            opt.step()

        root = detect(train).detection.root
        assert root.op == "aten.reciprocal.default" and root.phase == "backward"

    @staticmethod
    def _sam_first_step(write_weight: bool):
        """SAM by hand: `p.add_(rho * p.grad / p.grad.norm())` outside any optimizer step,
        with a head whose gradient is still exactly 0 (0/0)."""
        head = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(head.parameters(), lr=0.1)

        def train():
            loss = head(torch.ones(3, 2)).sum() * 0.0
            opt.zero_grad()
            loss.backward()
            with torch.no_grad():
                for p in head.parameters():
                    e = 0.05 * p.grad / p.grad.norm()
                    if write_weight:
                        p.add_(e)
                    else:
                        read_back(e)  # a diagnostic the script prints: not an update
            opt.step()

        return detect(train).detector

    def test_a_weight_update_written_by_hand_and_what_it_computes_are_the_optimizers(self):
        detection = self._sam_first_step(write_weight=True).detection
        assert [(s.op, s.phase) for s in detection.lineage] == [
            ("aten.div.Tensor", "optimizer"), ("aten.add_.Tensor", "optimizer")]
        assert detection.root.facts.own_optimizer  # the script's own code: the op's cause, not a setting

    def test_near_miss_the_same_division_read_as_a_diagnostic_stays_forward_and_trains_nothing(self):
        detector = self._sam_first_step(write_weight=False)
        birth = detector.recorder.latest_birth()
        assert detector.detection is None and birth.op == "aten.div.Tensor" and birth.phase == "forward"

    def test_near_miss_a_weight_read_outside_a_module_under_no_grad_is_not_an_update(self):
        w = torch.nn.Parameter(torch.tensor([0.0, 1.0]))
        opt = torch.optim.SGD([w], lr=0.1)

        def evaluate():
            w.sum().backward()
            opt.step()  # w = [-0.1, 0.9]
            with torch.no_grad():
                log_w = torch.log(w)  # reads the weight, writes nothing
            (w * log_w).sum().backward()
            opt.step()

        root = detect(evaluate).detection.root
        assert root.op == "aten.log.default" and root.phase == "forward"

    @staticmethod
    def _nan_row_through_regions(drop_after: bool):
        """A NaN feature row through torch.nn's own modules (regions: run with the per-op mode
        off, their saved tensors unrecorded), dropped from the loss only after the NLL."""
        model, nll = torch.nn.Linear(2, 1), torch.nn.GaussianNLLLoss(reduction="none")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def train():
            x = torch.tensor([[1.0, 2.0], [float("nan"), 1.0], [0.5, 0.5]])
            complete = ~torch.isnan(x).any(1)
            if not drop_after:
                x = x[complete]
            per_row = nll(model(x).squeeze(-1), torch.zeros(len(x)), torch.ones(len(x)))
            (per_row[complete] if drop_after else per_row).mean().backward()
            opt.step()

        return detect(train)

    def test_a_backward_op_given_a_nan_a_region_saved_is_traced_to_where_the_nan_entered(self):
        root = self._nan_row_through_regions(drop_after=True).detection.root
        assert root.op == "aten.lift_fresh.default" and root.backward_node is None and root.facts.entered

    def test_near_miss_rows_dropped_before_the_model_are_clean(self):
        assert not self._nan_row_through_regions(drop_after=False).stopped

    def test_a_module_name_is_recorded(self):
        class Head(torch.nn.Module):
            def forward(self, x):
                return torch.log(x)

        model = torch.nn.Sequential(torch.nn.Identity(), Head())
        d = detect(lambda: read_back(model(torch.tensor([-1.0])))).detection
        assert d.root.module == "1"

    def test_a_nan_inside_dataset_getitem_is_phase_data(self):
        class Data(torch.utils.data.Dataset):
            def __len__(self):
                return 4

            def __getitem__(self, i):
                m = torch.zeros(3) if i == 2 else torch.ones(3)
                return m / m.max()

        def load():
            for batch in torch.utils.data.DataLoader(Data(), batch_size=2):
                read_back(batch.sum())

        d = detect(load).detection
        assert d.root.phase == "data" and d.root.op == "aten.div.Tensor"
        assert d.lineage[1].op == "" and d.lineage[1].facts.batch.dataset_indices == (2,)

    @staticmethod
    def generator_training(loss_in_the_generator: bool):
        """Batches from a generator of the script's own: its masks normalised by their max,
        the second one empty (0/0). Or the generator also computes the loss."""
        model, opt = torch.nn.Linear(3, 3), None
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def batches():
            for i in range(3):
                mask = torch.zeros(3) if i == 1 else torch.rand(3) + 0.1
                target = mask / mask.max()  # MARK-stream
                if loss_in_the_generator:
                    yield torch.log(model(torch.ones(3)) - 10).mean()  # MARK-loss
                else:
                    yield torch.ones(3), target

        def train():
            for item in batches():
                loss = item if loss_in_the_generator else ((model(item[0]) - item[1]) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()

        return train

    def test_a_nan_made_inside_a_batch_generator_of_the_scripts_is_phase_data(self):
        d = detect(self.generator_training(loss_in_the_generator=False)).detection
        assert d.root.op == "aten.div.Tensor" and "MARK-stream" in d.root.location.code
        assert d.root.phase == "data"

    def test_near_miss_a_loss_computed_inside_a_generator_is_still_forward(self):
        d = detect(self.generator_training(loss_in_the_generator=True)).detection
        assert d.root.op == "aten.log.default" and "MARK-loss" in d.root.location.code
        assert d.root.phase == "forward"

    def test_a_training_loop_written_as_a_generator_runs_its_no_grad_targets_in_forward(self):
        # `def fit(): ... loss.backward(); opt.step(); yield logs`: a loop that trains and
        # reports as it goes, not a batch stream; its targets built without a graph are the
        # step's (here y / 0 at the third step).
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(8, 4), torch.randn(8, 3)

        def fit():
            for step in range(4):
                with torch.no_grad():
                    target = y / (2 - step)  # MARK-target
                loss = ((model(x) - target) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                yield step

        d = detect(lambda: list(fit())).detection
        assert d.root.op == "aten.div.Tensor" and "MARK-target" in d.root.location.code
        assert (d.root.phase, d.root.step) == ("forward", 2)

    @staticmethod
    def loader_with_a_nan_at_index_4():
        data = torch.ones(6, 2)
        data[4, 1] = float("nan")
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=3)

    def test_a_batch_arriving_non_finite_names_the_dataset_indices(self):
        loader, model = self.loader_with_a_nan_at_index_4(), torch.nn.Linear(2, 1)

        def train():
            for (x,) in loader:
                model(x).sum().backward()

        d = detect(train, check_batches=True).detection
        assert d.reason is StopReason.LOSS
        assert d.root.phase == "data" and d.root.op == ""
        assert d.root.facts.batch.number == 1 and d.root.facts.batch.dataset_indices == (4,)

    def test_near_miss_a_non_finite_batch_the_script_imputes_is_clean(self):
        loader, model = self.loader_with_a_nan_at_index_4(), torch.nn.Linear(2, 1)

        def train():
            for (x,) in loader:
                model(torch.nan_to_num(x, nan=0.0)).sum().backward()

        assert not detect(train, check_batches=True).stopped

    def test_max_steps_stops_cleanly(self):
        from nandoctor.detect.observer import StepLimitReached

        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        steps = []

        def train():
            for i in range(10):
                opt.zero_grad()
                model(torch.ones(1, 2)).sum().backward()
                opt.step()
                steps.append(i)

        try:
            detect(train, max_steps=2)
        except StepLimitReached:
            pass
        assert steps == [0]  # stopped inside the second step() call


class TestAllowedLines:
    def test_a_line_marked_allow_is_accepted_and_counted_as_allowed(self):
        def metric():
            ratio = torch.tensor([1.0, 0.0]) / torch.tensor([2.0, 0.0])  # nandoctor: allow
            print(ratio.tolist())

        result = detect(metric)
        assert not result.stopped
        [allowed] = result.detector.discarded()
        assert allowed.allowed and allowed.op == "aten.div.Tensor" and allowed.made == "nan"

    def test_the_config_allows_a_file_line_or_an_op_pattern(self):
        line = line_of("MARK-config-allow")

        def metric():
            print((torch.tensor([0.0]) / 0).tolist())  # MARK-config-allow

        assert not detect(metric, allow=[f"test_detector.py:{line}"]).stopped
        assert not detect(metric, allow=["aten.div.*"]).stopped
        assert detect(metric, allow=["aten.log.*"]).stopped

    def test_an_allowed_value_that_reaches_the_loss_still_stops_the_run(self):
        w = torch.nn.Parameter(torch.ones(2))

        def train():
            bad = torch.log(w - 1)  # nandoctor: allow
            (w * bad).sum().backward()

        d = detect(train).detection
        assert d is not None and d.reason is StopReason.LOSS
        assert d.root.facts.inf_written_at.line == line_of("bad = torch.log(w - 1)")


class TestMasksPassedOn:
    """A -inf mask added to the scores (what SDPA does with a float mask) is the mask again,
    not a new Inf: its output carries the mask's record. Anything the op may have made of
    its own (a NaN, an Inf of the other sign) is still a birth."""

    @staticmethod
    def causal_mask(n: int = 4) -> torch.Tensor:
        return torch.zeros(n, n).masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))

    def test_a_mask_added_to_scores_is_carried_and_nothing_is_made(self):
        def attend():
            scores = torch.randn(2, 4, 4) + self.causal_mask()
            read_back(torch.softmax(scores, -1))

        result = detect(attend)
        assert not result.stopped and result.detector.discarded() == []

    def test_a_transformer_encoder_with_a_causal_mask_makes_nothing(self):
        def train():
            torch.manual_seed(0)
            layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
            mask = torch.nn.Transformer.generate_square_subsequent_mask(5)
            layer(torch.randn(3, 5, 16), src_mask=mask, is_causal=True).sum().backward()

        result = detect(train)
        assert not result.stopped and result.detector.discarded() == []

    def test_a_mask_averaged_into_the_loss_is_born_at_the_mean_that_used_it(self):
        # Label smoothing over masked log-probabilities: -logp.mean() is +inf. The mask is
        # passed on through log_softmax; the mean over masked positions is where it was
        # used as a number, and it has the mask's write as its parent.
        def smoothed():
            logits = torch.randn(2, 4, requires_grad=True)
            logp = logits.masked_fill(torch.tensor([False, False, True, True]), float("-inf")).log_softmax(-1)
            (-logp.mean(-1)).mean().backward()

        result = detect(smoothed)
        assert result.stopped and result.detection.root.op == "aten.mean.dim"
        assert result.detection.root.facts.inf_written_at is not None

    @staticmethod
    def _softmax_by_hand_over_masked_scores(stable: bool):
        def pool():
            scores = torch.tensor([[88.8, 1.0, 0.0]], requires_grad=True)
            z = scores.masked_fill(torch.tensor([[False, False, True]]), float("-inf"))
            w = torch.exp(z - z.max(1, keepdim=True).values if stable else z)  # MARK-exp-masked
            (w / w.sum(1, keepdim=True)).sum().backward()

        return pool

    def test_an_exp_of_masked_scores_that_overflows_made_its_inf_not_the_mask(self):
        # exp(-inf) = 0: the mask is gone there; the +inf is exp(88.8), made at the exp.
        d = detect(self._softmax_by_hand_over_masked_scores(stable=False)).detection
        assert d.root.op == "aten.exp.default" and d.root.location.line == line_of("MARK-exp-masked")

    def test_near_miss_the_same_softmax_by_hand_with_the_max_taken_out_is_clean(self):
        assert not detect(self._softmax_by_hand_over_masked_scores(stable=True)).stopped

    def test_a_mask_whose_sign_flips_on_the_way_to_the_loss_is_still_the_mask(self):
        def picked():
            logits = torch.randn(2, 4, requires_grad=True)
            logp = logits.masked_fill(torch.tensor([False, False, True, True]), float("-inf")).log_softmax(-1)
            (-logp[:, 3]).backward(torch.ones(2))

        result = detect(picked)
        assert result.stopped and result.detection.root.op == "aten.masked_fill.Scalar"
        assert result.detection.root.facts.written_on_purpose

    def test_near_miss_a_flipped_mask_that_a_softmax_consumes_makes_nothing(self):
        def nearest():  # a softmax over negated distances, +inf where masked
            dist = torch.rand(3, 4).masked_fill(torch.tensor([True, False, False, False]), float("inf"))
            read_back(torch.softmax(-dist, -1))

        result = detect(nearest)
        assert not result.stopped and result.detector.discarded() == []

    def test_near_miss_a_mask_minus_itself_makes_a_nan_of_its_own(self):
        def use():
            masked = torch.randn(4, 4) + self.causal_mask()
            read_back(masked - masked)  # -inf - (-inf)

        result = detect(use)
        assert result.stopped and result.detection.root.op == "aten.sub.Tensor"

    def test_near_miss_an_inf_on_an_allowed_line_is_not_a_mask(self):
        def metric():
            bad = torch.log(torch.tensor([1.0, 0.0]))  # nandoctor: allow
            print((bad * 2).tolist())

        result = detect(metric)
        assert result.stopped and result.detection.root.op == "aten.mul.Tensor"
        assert [d.allowed for d in result.detector.discarded()] == [True]


class TestMasksOverValuesMadeByAccident:
    """A fill writes -inf on purpose; values made by accident that it leaves in place are
    still what they were: the lineage goes through the fill to where they were made."""

    @staticmethod
    def _contrastive(temperature: float, keep: bool):
        def logits():
            sim = torch.tensor([[1.0, 0.5, -0.2], [0.5, 1.0, 0.3], [-0.2, 0.3, 1.0]])
            scores = sim / torch.tensor(temperature)  # MARK-temperature (annealed to 0: ±inf)
            scores = scores.masked_fill(torch.eye(3, dtype=torch.bool), float("-inf"))  # no self-pairs
            p = torch.softmax(scores, -1)
            read_back(torch.where(torch.isfinite(p), p, 0.0) if not keep else p)

        return detect(logits)

    def test_a_division_by_a_zero_temperature_under_a_diagonal_mask_is_rooted_at_the_division(self):
        d = self._contrastive(0.0, keep=True).detection
        assert d.root.op == "aten.div.Tensor" and d.root.location.line == line_of("MARK-temperature")

    def test_near_miss_the_same_mask_over_a_finite_temperature_is_clean(self):
        assert not self._contrastive(0.1, keep=True).stopped

    def test_near_miss_a_fill_that_covers_every_accidental_value_is_a_mask_again(self):
        def padded_rows():
            counts = torch.tensor([2.0, 0.0])  # row 1 is padding: x / 0
            scores = torch.ones(2, 3) / counts[:, None]
            masked = scores.masked_fill(torch.tensor([[False] * 3, [True] * 3]), float("-inf"))
            p = torch.where(counts[:, None] > 0, torch.softmax(masked, -1), 0.0)
            read_back(p)
            return masked

        result = detect(padded_rows)
        assert not result.stopped


class TestNanHidden:
    """An op that turns a NaN into finite values hides it: a cast to integers (a missing
    class label read from a CSV as NaN becomes -2**63), a sampling grid that clips NaN
    coordinates to the border. The run stops there (for integers, where they are used: see
    test_hidden_nan.py), rooted where the NaN was made; an op that handles NaN
    (`nan_to_num`, `isnan`, `nanmean`) does not hide it, it handles it."""

    @staticmethod
    def _labels(handled: bool):
        import numpy as np

        y = (np.arange(20) % 2).astype("float32")
        y[7] = np.nan  # a missing label

        def read():
            labels = torch.from_numpy(y)  # MARK-labels-entered
            classes = (torch.nan_to_num(labels, nan=0.0) if handled else labels).long()
            return F.cross_entropy(torch.zeros(20, 2), classes)  # (where the integers are used)

        return read

    def test_a_nan_label_cast_to_integers_stops_rooted_where_it_entered(self):
        result = detect(self._labels(handled=False))
        assert result.stopped and result.detection.reason is StopReason.NAN_HIDDEN
        assert result.detection.hidden_by == "aten._to_copy"
        assert result.detection.root.location.line == line_of("MARK-labels-entered")

    def test_near_miss_labels_whose_nan_is_replaced_first_cast_clean(self):
        assert not detect(self._labels(handled=True)).stopped

    @pytest.mark.parametrize("padding", ["border", "zeros"])
    def test_a_nan_sampling_grid_clipped_to_the_border_stops_at_its_division(self, padding):
        # Pixel coordinates normalised by (W - 1) on a 1-pixel-wide level: 0/0.
        image = torch.nn.Parameter(torch.randn(1, 1, 4, 1))

        def warp():
            w = image.shape[-1]
            gx = 2 * torch.zeros(1, 4, 1) / (w - 1) - 1  # MARK-grid-norm
            grid = torch.stack([gx, torch.linspace(-1, 1, 4).view(1, 4, 1)], -1)
            read_back(torch.nn.functional.grid_sample(image, grid, padding_mode=padding, align_corners=True).sum())

        result = detect(warp)
        assert result.stopped and result.detection.root.location.line == line_of("MARK-grid-norm")

    def test_near_miss_nan_aware_reductions_handle_a_nan_they_skip(self):
        def metric():
            x = torch.tensor([1.0, 0.0]) / torch.tensor([1.0, 0.0])  # 1, nan
            return torch.nanmean(x)

        assert not detect(metric).stopped


class TestConcatenatedFeatures:
    """Features pooled from one sequence are concatenated before the classifier: the -inf
    max-pool of an empty sequence (written on purpose by its mask) beside the NaN its
    attention pool made. The lineage follows the value made by accident to its op."""

    @staticmethod
    def _pooled_classifier(empty_sequence: bool):
        torch.manual_seed(0)
        score, out = torch.nn.Linear(4, 1), torch.nn.Linear(8, 2)
        h = torch.randn(3, 5, 4)
        valid = torch.ones(3, 5, dtype=torch.bool)
        if empty_sequence:
            valid[1] = False
        else:
            valid[1, 1:] = False

        def classify():
            max_pool = h.masked_fill(~valid[..., None], float("-inf")).max(dim=1).values
            s = score(h).squeeze(-1).masked_fill(~valid, float("-inf"))
            att = (torch.softmax(s, dim=1)[..., None] * h).sum(1)  # MARK-att-pool
            logits = out(torch.cat([max_pool, att], dim=-1))
            torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 0])).backward()

        return classify

    def test_an_empty_sequence_is_rooted_at_its_attention_softmax_not_the_classifier(self):
        d = detect(self._pooled_classifier(empty_sequence=True)).detection
        assert d.root.op == "aten._softmax.default" and d.root.location.line == line_of("MARK-att-pool")

    def test_near_miss_a_sequence_with_one_valid_token_is_clean(self):
        assert not detect(self._pooled_classifier(empty_sequence=False)).stopped


class TestSentinels:
    """An infinity the script writes as a starting value — the best loss so far, the start of
    a running max — is written on purpose, however it enters torch: it may be read back and
    compared with. Used as a number, it is still found, at the line that wrote it."""

    @pytest.mark.parametrize("make", [
        lambda: torch.tensor(float("inf")),
        lambda: torch.full((), float("inf")),
        lambda: torch.as_tensor(float("inf")),
    ])
    def test_a_best_so_far_sentinel_may_be_read_and_compared(self, make):
        def track():
            best = make()
            for loss in (torch.tensor(2.0), torch.tensor(1.0)):
                print(f"best so far {best.item()}")
                best = torch.minimum(best, loss)
            read_back(best)

        assert not detect(track).stopped

    def test_a_running_max_may_start_at_minus_inf(self):
        def running_max():
            peak = torch.tensor([float("-inf")] * 3)
            for _ in range(2):
                peak = torch.maximum(peak, torch.randn(3))
            read_back(peak)

        assert not detect(running_max).stopped

    def test_a_sentinel_used_as_a_number_is_found_where_it_was_written(self):
        def scaled():
            scale = torch.tensor(float("inf"))  # MARK-sentinel
            w = torch.randn(3, requires_grad=True)
            (w.pow(2).mean() * scale).backward()

        result = detect(scaled)
        assert result.stopped and result.detection.root.location.line == line_of("MARK-sentinel")

    def test_a_causal_mask_built_with_numpy_is_a_mask_in_a_buffer_and_in_a_checkpoint(self):
        import numpy as np

        class Attention(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("causal", torch.from_numpy(np.triu(np.full((6, 6), -np.inf), k=1)).float())

            def forward(self, q):
                return torch.softmax(q @ q.T + self.causal[:len(q), :len(q)], -1)

        def train():
            model = Attention()
            read_back(model(torch.randn(5, 3)).sum())
            torch.save(model.state_dict(), io.BytesIO())

        assert not detect(train).stopped

    @pytest.mark.parametrize("make", [
        lambda: torch.tensor([0.0, 0.5, -float("inf"), float("inf")]),
        lambda: torch.tensor([[0.0, math.inf], [-math.inf, 2.0]]),
    ])
    def test_bounds_typed_with_infinities_at_the_line_that_builds_them_may_be_read_back(self, make):
        def box():
            lower = make()
            slack = torch.randn(lower.shape) - lower  # inf where a side is unbounded
            read_back(slack)

        assert not detect(box).stopped

    def test_near_miss_a_nan_typed_among_them_is_never_on_purpose(self):
        result = detect(lambda: read_back(torch.tensor([0.0, float("inf"), float("nan")]) * 2))
        assert result.stopped and not result.detection.root.facts.written_on_purpose

    @pytest.mark.parametrize("dtype", [None, torch.float32])
    def test_data_with_nan_markers_printed_as_it_came_is_looked_at_not_used(self, dtype):
        # A notebook's `print(y[:5])` of targets with missing values: what training does
        # with them is checked where it trains.
        prices = np.array([1.5, np.nan, 2.5, 3.0])
        assert not detect(lambda: read_back(torch.tensor(prices, dtype=dtype)[:2])).stopped

    def test_near_miss_a_value_computed_from_data_with_nan_markers_and_read_is_a_use(self):
        prices = np.array([1.5, np.nan, 2.5, 3.0])
        result = detect(lambda: read_back(torch.tensor(prices).mean()))
        assert result.stopped and result.detection.root.facts.entered

    @staticmethod
    def _scores_masked_with_the_dtype_minimum(row_with_nothing: bool):
        """NT-Xent in bfloat16: the diagonal masked with finfo.min, then divided by the
        temperature, which takes it past the range to -inf; a log prints it."""
        torch.manual_seed(0)
        sim = torch.randn(4, 4, dtype=torch.bfloat16)
        mask = torch.eye(4, dtype=torch.bool)
        if row_with_nothing:
            mask[0] = True
        scores = sim.masked_fill(mask, torch.finfo(sim.dtype).min) / 0.1
        read_back(scores[1, 1])
        read_back(torch.softmax(scores.float(), -1))

    def test_a_dtype_minimum_mask_scaled_past_the_range_is_still_a_mask(self):
        assert not detect(lambda: self._scores_masked_with_the_dtype_minimum(row_with_nothing=False)).stopped

    def test_near_miss_a_row_it_masks_entirely_still_makes_the_softmax_nan(self):
        result = detect(lambda: self._scores_masked_with_the_dtype_minimum(row_with_nothing=True))
        assert result.stopped and result.detection.root.op == "aten._softmax.default"

    @staticmethod
    def _padding_bias_cast_to_half(pad_everything_in_a_row: bool):
        """An additive padding bias written with -1e9 for minus infinity, cast to the scores'
        float16 (where -1e9 is -inf), added, and softmaxed: the Annotated Transformer's mask
        under autocast."""
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(2, 4).half())
        keep = torch.tensor([[True, True, True, False], [True, False, True, True]])
        if pad_everything_in_a_row:
            keep[1] = False
        bias = ((~keep).float() * -1e9).half()
        weights = (w + bias).softmax(-1)
        (weights[:, 0].float() - 1).pow(2).mean().backward()
        read_back(weights)

    def test_a_large_negative_mask_cast_past_float16s_range_is_still_a_mask(self):
        assert not detect(lambda: self._padding_bias_cast_to_half(pad_everything_in_a_row=False)).stopped

    def test_near_miss_a_row_the_cast_mask_pads_entirely_makes_the_softmax_nan(self):
        result = detect(lambda: self._padding_bias_cast_to_half(pad_everything_in_a_row=True))
        assert result.stopped and result.detection.root.op == "aten._softmax.default"

    def test_near_miss_a_constant_with_no_zeros_scaled_past_the_range_is_no_mask(self):
        result = detect(lambda: read_back(torch.full((4,), -1e9).half()))
        assert result.stopped and result.detection.root.op == "aten._to_copy.default"

    def test_near_miss_activations_cast_past_float16s_range_are_an_overflow(self):
        # Zeros (a ReLU's) and large values, but not one constant: activations, not a mask.
        h = torch.tensor([0.0, 7e4, 0.0, 9e4, 1.0])
        result = detect(lambda: read_back(h.half()))
        assert result.stopped and result.detection.root.op == "aten._to_copy.default"

    def test_near_miss_an_ordinary_overflow_read_back_is_no_mask(self):
        result = detect(lambda: read_back(torch.tensor([3e38, 1.0]) * 2))
        assert result.stopped and result.detection.root.op == "aten.mul.Tensor"

    def test_near_miss_data_with_an_inf_among_finite_values_is_input_data(self):
        def load():
            row = [float(v) for v in "1.0 inf 3.0".split()]  # parsed from a file
            read_back(torch.tensor(row) * 2)  # (used: data only looked at is no stop)

        result = detect(load)
        assert result.stopped and result.detection.root.facts.entered
        assert not result.detection.root.facts.written_on_purpose

    def test_a_nan_typed_as_a_no_value_yet_placeholder_may_be_read(self):
        def logger():
            ema = torch.tensor(float("nan"))  # no loss seen yet
            print(f"ema before training: {ema.item()}")
            losses = [torch.tensor(2.0), torch.tensor(1.0)]
            seen = 0
            best = float("inf")
            for loss in losses:
                ema = loss if torch.isnan(ema) else 0.9 * ema + 0.1 * loss
                seen, best = seen + 1, min(best, loss.item())
            read_back(ema)

        assert not detect(logger).stopped

    def test_near_miss_a_nan_placeholder_used_as_a_number_is_found(self):
        def logger():
            ema = torch.tensor(float("nan"))
            for loss in (torch.tensor(2.0), torch.tensor(1.0)):
                ema = 0.9 * ema + 0.1 * loss  # never replaced: NaN for good
            read_back(ema)

        assert detect(logger).stopped


class TestSentinelsInCopiesAndCheckpoints:
    """A module's ±inf sentinel buffers (a best score, a running minimum) travel with it:
    through a checkpoint file, even one an earlier run wrote, and through `deepcopy`."""

    class Tracker(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 1)
            self.register_buffer("best", torch.tensor(float("inf")))
            self.register_buffer("low", torch.full((2,), float("inf")))

    def test_a_checkpoint_an_earlier_run_saved_loads_its_sentinels_without_alarm(self, tmp_path):
        torch.save(self.Tracker().state_dict(), tmp_path / "last.pt")  # before this run

        def resume():
            model = self.Tracker()
            model.load_state_dict(torch.load(tmp_path / "last.pt"))
            print(model.best.item(), model.low.tolist())

        assert not detect(resume).stopped

    def test_a_deepcopy_of_the_model_keeps_its_sentinels_sentinels(self):
        import copy

        def ema_copy():
            ema = copy.deepcopy(self.Tracker())
            print(ema.low.tolist(), ema.best.item())

        assert not detect(ema_copy).stopped

    def _checkpoint_with(self, value: float, path):
        """The Tracker's weights saved with one bad value in `lin.weight`."""
        state = self.Tracker().state_dict()
        state["lin.weight"][0, 1] = value
        torch.save(state, path)
        return path

    def test_a_checkpoint_loaded_after_the_optimizer_is_made_is_still_init(self, tmp_path):
        checkpoint = self._checkpoint_with(float("nan"), tmp_path / "bad.pt")

        def resume():
            model = self.Tracker()
            torch.optim.SGD(model.parameters(), lr=0.1)  # training has started
            model.load_state_dict(torch.load(checkpoint))

        result = detect(resume)
        assert result.stopped and result.detection.root.phase == "init"

    def test_near_miss_a_checkpoint_with_an_inf_among_its_weights_is_still_a_bad_parameter(self, tmp_path):
        checkpoint = self._checkpoint_with(float("inf"), tmp_path / "bad.pt")

        def resume():
            model = self.Tracker()
            model.load_state_dict(torch.load(checkpoint))
            model.lin(torch.ones(1, 2)).sum().backward()

        result = detect(resume)
        assert result.stopped and result.detection.root.facts.parameter.name == "lin.weight"
