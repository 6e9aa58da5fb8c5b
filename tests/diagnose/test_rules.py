"""Each cause rule: a case that fires it, and near-misses that must not.

The cases run for real under the detector (in-process), so the rules see exactly what
they see in a user's run.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import detect, read_back, run_nandoctor
from nandoctor.detect.result import Detection, Location, Site, SiteFacts, StopReason
from nandoctor.diagnose import build_report
from nandoctor.stats import TensorSummary, summarize


def optimizer_by_hand(update: str, loss: str) -> str:
    """A training script with an optimizer it wrote itself: `update` is its step()'s body for
    each parameter `p` (two lines: lines 10 and 11), `loss` what two steps train on."""
    first, second = update.strip().splitlines()
    return f"""\
import torch

class ByHand(torch.optim.Optimizer):
    def __init__(self, params):
        super().__init__(params, dict(lr=0.1))

    @torch.no_grad()
    def step(self):
        for p in self.param_groups[0]["params"]:
            {first.strip()}
            {second.strip()}

table = torch.nn.Embedding(4, 2)
opt = ByHand(table.parameters())
for _ in range(2):
    opt.zero_grad()
    ({loss}).backward()
    opt.step()
"""


# A LARS trust ratio with no guard for a gradient norm of 0 (a head whose loss weight is 0).
SIMPLEX_STEP_HOOK = """import torch

mix = torch.nn.Parameter(torch.tensor([[0.5, -0.2], [-0.1, -0.3]]))
opt = torch.optim.SGD([mix], lr=0.1)


def project(optimizer, args, kwargs):
    with torch.no_grad():
        kept = mix.clamp(min=0)
        mix.copy_(kept / kept.sum(0, keepdim=True))


opt.register_step_post_hook(project)
for step in range(3):
    loss = (torch.ones(2) @ mix).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


LARS_BY_HAND = optimizer_by_hand("""
    trust = p.norm() / p.grad.norm()
    p.sub_(p.grad * trust)
""", "table(torch.tensor([0, 1])).sum() * 0.0")

# An RMSprop with no epsilon: the rows never looked up keep a second moment of 0.
RMSPROP_BY_HAND = optimizer_by_hand("""
    v = self.state[p].setdefault("v", torch.zeros_like(p)).mul_(0.9).addcmul_(p.grad, p.grad, value=0.1)
    p.sub_(0.01 * p.grad * torch.rsqrt(v))
""", "table(torch.tensor([0, 1])).sum()")

# An Adagrad with no epsilon: addcdiv_ divides by the root of a sum that is 0 for unseen rows.
ADAGRAD_BY_HAND = optimizer_by_hand("""
    h = self.state[p].setdefault("h", torch.zeros_like(p)).addcmul_(p.grad, p.grad)
    p.addcdiv_(p.grad, h.sqrt(), value=-0.01)
""", "table(torch.tensor([0, 1])).sum()")


def reading(fn):
    """`fn`, whose result the script then reads back (prints, logs): a value nobody reads
    never matters, so the cases below read theirs."""

    def run():
        out = fn()
        if isinstance(out, torch.Tensor):
            read_back(out)

    return run


def cause_of(fn, **settings):
    result = detect(reading(fn), **settings)
    assert result.stopped, "expected the detector to stop"
    detector = result.detector
    report = build_report("t.py", exit_code=3, detection=result.detection, step=detector.state.step_or_none,
                          history=detector.history())
    return report.cause


def cause_of_root(root: Site):
    """The cause of a detection whose root is also its event (a site built by hand)."""
    return build_report("t.py", exit_code=3, detection=Detection(StopReason.OP_MADE_NAN, root, root, [root])).cause


def stays_clean(fn, **settings) -> bool:
    return not detect(reading(fn), **settings).stopped


def train_steps(loss_fn, params, steps=1, lr=0.1, opt_cls=torch.optim.SGD, **opt_kwargs):
    opt = opt_cls(params, lr=lr, **opt_kwargs)

    def run():
        for _ in range(steps):
            opt.zero_grad()
            loss_fn().backward()
            opt.step()

    return run


class TestLogNonpositive:
    def test_log_of_zero_and_negatives_counts_them(self):
        cause = cause_of(lambda: torch.log(torch.tensor([0.0, -1.0, 2.0])))
        assert cause.id == "log_nonpositive"
        assert "1 of 3 inputs are 0" in cause.explanation and "1 of 3 are negative" in cause.explanation
        assert "clamp_min" in cause.fix
        assert "log_softmax" not in cause.fix  # (no softmax made its input)

    def test_log_of_a_softmax_points_at_log_softmax(self):
        logits = torch.nn.Parameter(torch.tensor([[0.0, -200.0]]))  # (exp(-200) underflows to 0)
        cause = cause_of(lambda: torch.log(torch.softmax(logits, -1)).sum())
        assert cause.id == "log_nonpositive" and "log_softmax" in cause.fix

    def test_log_of_one_minus_a_bfloat16_probability_that_rounded_to_one(self):
        logits = torch.tensor([2.0, 7.0])  # sigmoid(7) = 0.9991: exactly 1.0 in bfloat16
        with torch.autocast("cpu", dtype=torch.bfloat16):
            cause = cause_of(lambda: torch.log(1 - torch.sigmoid(logits.bfloat16())))
        assert cause.id == "log_nonpositive" and "bfloat16" in cause.explanation
        assert "logsigmoid" in cause.fix

    def test_xlogy_speaks_of_the_values_under_its_log_not_of_the_factor(self):
        # Beta.log_prob runs xlogy(a - 1, x): the log is of x (a CTR of exactly 0), and
        # a - 1, negative here, only multiplies it.
        cause = cause_of(lambda: torch.xlogy(torch.tensor([-0.5, -0.4]), torch.tensor([0.0, 0.3])))
        assert cause.id == "log_nonpositive"
        assert "1 of 2 inputs are 0" in cause.explanation and "negative" not in cause.explanation

    def test_near_miss_a_float32_log_of_zero_says_nothing_of_rounding(self):
        cause = cause_of(lambda: torch.log(1 - torch.tensor([0.5, 1.0])))
        assert "rounds" not in cause.explanation and "logsigmoid" not in cause.fix

    @pytest.mark.parametrize("dtype, logit, above", [(torch.float32, 20.0, "about 17 is 1.0 in float32"),
                                                     (torch.bfloat16, 7.0, "about 6 is 1.0 in bfloat16")])
    def test_log_of_one_minus_a_saturated_sigmoid_points_at_log_sigmoid(self, dtype, logit, above):
        # sigmoid(20) is 1.0 in float32; in bfloat16 already sigmoid(7) is (8 bits of mantissa).
        logits = torch.nn.Parameter(torch.tensor([2.0, logit], dtype=dtype))
        cause = cause_of(lambda: torch.log(1 - torch.sigmoid(logits)))
        assert "`1 - p`" in cause.explanation and above in cause.explanation
        assert cause.fix.startswith("Compute it in log space (`F.logsigmoid")

    def test_log_of_a_running_sum_of_exps_that_underflowed_points_at_logcumsumexp(self):
        risk = torch.nn.Parameter(torch.tensor([-700.0, -800.0]))  # a Cox risk set's scores
        cause = cause_of(lambda: torch.log(torch.cumsum(torch.exp(risk), 0)))
        assert "underflowed" in cause.explanation and "logcumsumexp" in cause.fix

    def test_near_miss_a_log_of_a_sum_with_no_exp_on_its_line_says_nothing_of_underflow(self):
        counts = torch.nn.Parameter(torch.tensor([0.0, 0.0]))
        cause = cause_of(lambda: torch.log(torch.cumsum(counts, 0)))
        assert "underflowed" not in cause.explanation and "logcumsumexp" not in cause.fix

    def test_log_backward_of_an_underflowed_softmax(self):
        logits = torch.nn.Parameter(torch.tensor([[200.0, 0.0, -200.0]]))
        cause = cause_of(lambda: -(torch.tensor([[0.0, 0.0, 1.0]]) * torch.log(torch.softmax(logits, -1))).sum().backward())
        assert cause.id == "log_nonpositive"
        assert "log_softmax" in cause.fix

    def test_a_gradient_formula_that_takes_a_log_is_judged_as_that_log(self):
        # entr(p) = -p log p is 0 at p = 0, its gradient -(log p + 1) is infinite there: the
        # backward's own log of 0 is the root, where a masked logit made p exactly 0.
        logits = torch.nn.Parameter(torch.tensor([[1.0, 2.0, 0.5]]))
        legal = torch.tensor([[True, True, False]])
        cause = cause_of(lambda: torch.special.entr(torch.softmax(logits.masked_fill(~legal, float("-inf")), -1))
                         .sum().backward())
        assert cause.id == "log_nonpositive"
        assert "gradient of `special_entr`" in cause.title and "a logit was -inf (a mask)" in cause.explanation

    def test_near_miss_entr_of_a_softmax_with_no_mask_is_clean(self):
        logits = torch.nn.Parameter(torch.tensor([[1.0, 2.0, 0.5]]))
        assert stays_clean(lambda: torch.special.entr(torch.softmax(logits, -1)).sum().backward())

    def test_near_miss_log_of_a_tiny_positive_number_is_fine(self):
        assert stays_clean(lambda: torch.log(torch.tensor([1e-30, 1e-38])))


GRU_OVER_PRICE_RATIOS = """import torch

torch.manual_seed(0)
prices = torch.tensor([[[100.0], [101.0], [0.0], [102.0]]])
gru = torch.nn.GRU(1, 4, batch_first=True)
opt = torch.optim.SGD(gru.parameters(), lr=0.1)
for step in range(3):
    ratios = prices[:, 1:] / prices[:, :-1]
    loss = gru(ratios)[0][:, -1].pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


class TestDivision:
    def test_zero_over_zero_is_div_by_zero(self):
        mask = torch.zeros(4, 4)
        cause = cause_of(lambda: mask / mask.max())
        assert cause.id == "div_by_zero"
        assert "0/0 = NaN" in cause.explanation and "all zeros" in cause.explanation

    def test_a_denominator_with_negative_values_is_guarded_keeping_its_sign(self):
        d = torch.tensor([-2.0, 0.0, 3.0])
        cause = cause_of(lambda: torch.ones(3) / d)
        assert cause.id == "div_by_zero" and "keeping its sign" in cause.fix and "d.abs() < eps" in cause.fix

    def test_an_angle_by_hand_points_at_atan2(self):
        v = torch.tensor([[0.0, 0.0], [1.0, 2.0]])
        cause = cause_of(lambda: torch.atan(v[:, 1] / v[:, 0]).sum())
        assert cause.id == "div_by_zero" and "torch.atan2(y, x)" in cause.fix

    def test_division_by_a_zero_std_is_zero_variance(self):
        x = torch.nn.Parameter(torch.ones(8, 3))
        cause = cause_of(lambda: ((x - x.mean(0)) / x.std(0)).sum())
        assert cause.id == "zero_variance"
        assert "eps" in cause.fix or "1e-5" in cause.fix
        assert "cancelled" not in cause.explanation  # (float32: no word of 16-bit cancellation)

    def test_a_bfloat16_zero_variance_may_have_cancelled_and_is_computed_in_float32(self):
        x = torch.nn.Parameter(torch.ones(8, 3).bfloat16())
        cause = cause_of(lambda: ((x - x.mean(0)) / x.std(0)).sum())
        assert cause.id == "zero_variance" and "cancelled" in cause.explanation
        assert cause.fix.startswith("Compute the statistics in float32")

    @pytest.mark.parametrize("normalise", [
        lambda x: (x - x.mean(0)) / x.std(0),
        lambda x: (x - x.min(0).values) / (x.max(0).values - x.min(0).values),
    ])
    def test_a_constant_column_normalised_without_autograd_is_zero_variance(self, normalise):
        x = torch.ones(8, 3)
        cause = cause_of(lambda: normalise(x))
        assert cause.id == "zero_variance"

    def test_a_column_divided_in_place_by_a_spread_kept_in_a_variable_is_zero_variance(self):
        def standardise():
            x = torch.ones(8, 3)
            sd = x[:, 1].std()
            x[:, 1] /= sd
            return x

        assert cause_of(standardise).id == "zero_variance"

    def test_a_divisor_assigned_a_std_just_above_under_any_name_is_zero_variance(self):
        def window():  # a time series window of a flat segment, normalised in __getitem__
            past = torch.ones(8)
            mu, sigma = past.mean(), past.std()
            return (past - mu) / sigma

        assert cause_of(window).id == "zero_variance"

    def test_a_divisor_that_subtracts_a_min_from_a_max_kept_in_names_is_zero_variance(self):
        def min_max_scale():  # a constant sensor channel scaled to [0, 1]
            raw = torch.ones(8, 3)
            lo, hi = raw.min(dim=0).values, raw.max(dim=0).values
            return (raw - lo) / (hi - lo)

        assert cause_of(min_max_scale).id == "zero_variance"

    def test_a_min_max_scaling_of_a_constant_is_a_zero_range_with_the_ranges_guard(self):
        t = torch.nn.Parameter(torch.ones(4))
        cause = cause_of(lambda: (t - t.min()) / (t.max() - t.min()))
        assert cause.id == "zero_variance" and "range" in cause.title and "(hi - lo).clamp_min(eps)" in cause.fix

    def test_near_miss_a_difference_of_names_that_are_no_range_is_plain_division_by_zero(self):
        def per_gap():
            start, end = torch.ones(3), torch.ones(3)
            return torch.ones(3) / (end - start)

        assert cause_of(per_gap).id == "div_by_zero"

    def test_near_miss_a_divisor_assigned_something_else_is_plain_division_by_zero(self):
        def rescale():
            past = torch.ones(8)
            sigma = past.sum() * 0  # a scale, not a spread
            return past / sigma

        assert cause_of(rescale).id == "div_by_zero"

    def test_near_miss_a_word_that_merely_contains_sd_is_plain_division_by_zero(self):
        def per_price():
            usd_price = torch.tensor([0.0, 2.0])
            return torch.tensor([1.0, 1.0]) / usd_price

        assert cause_of(per_price).id == "div_by_zero"

    def test_near_miss_a_zero_count_is_plain_division_by_zero(self):
        counts = torch.tensor([0.0, 2.0])
        cause = cause_of(lambda: torch.tensor([0.0, 1.0]) / counts)
        assert cause.id == "div_by_zero"

    def test_near_miss_masked_division_done_the_safe_way(self):
        pred = torch.nn.Parameter(torch.randn(6))
        target = torch.tensor([1.0, 0.0, 2.0, 0.0, 3.0, 1.0])

        def loss():
            mask = target != 0
            safe = torch.where(mask, target, torch.ones_like(target))
            return torch.where(mask, (pred - target) / safe, 0.0).abs().mean()

        assert stays_clean(train_steps(loss, [pred]))

    def test_a_division_by_zero_whose_nan_reaches_the_loss_is_the_direct_cause(self):
        pred = torch.nn.Parameter(torch.randn(4))
        target = torch.tensor([1.0, 0.0, 2.0, 0.0])
        cause = cause_of(train_steps(lambda: ((pred - target) / target).abs().mean(), [pred]))
        assert cause.id == "div_by_zero"

    def test_values_dropped_by_an_index_put_leak_into_the_gradient(self):
        pred = torch.nn.Parameter(torch.rand(4) + 0.5)
        weight = torch.tensor([1.0, 0.0, 2.0, 0.0])

        def loss():
            per_item = -torch.log(pred * weight / weight)
            per_item[weight == 0] = 0  # the NaNs are overwritten: the loss is finite
            return per_item.sum()

        cause = cause_of(train_steps(loss, [pred]))
        assert cause.id == "masked_inf_gradient_leak"

    def test_zero_over_zero_in_place_is_div_by_zero_not_inf_arithmetic(self):
        def zero_over_zero():
            x = torch.ones(3, 2)
            x[0] = 0
            x[0] /= 0
            return x

        cause = cause_of(zero_over_zero)
        assert cause.id == "div_by_zero" and "0/0 = NaN" in cause.explanation

    def test_near_miss_an_in_place_division_by_a_nonzero_number_is_fine(self):
        def fine():
            x = torch.ones(3, 2)
            x[0] /= 4
            return x

        assert stays_clean(fine)

    def test_a_bfloat16_one_minus_beta_that_rounded_to_zero_says_so_and_computes_it_in_float32(self):
        # Class-balanced weights: (1 - beta) / (1 - beta**n), beta = 0.999 is 1.0 in bfloat16.
        beta, counts = torch.tensor(0.999).bfloat16(), torch.tensor([5.0, 50.0]).bfloat16()
        cause = cause_of(lambda: (1 - beta) / (1 - beta ** counts))
        assert cause.id == "div_by_zero" and "bfloat16" in cause.explanation and "float32" in cause.fix

    def test_near_miss_a_float32_zero_denominator_says_nothing_of_rounding(self):
        cause = cause_of(lambda: torch.ones(2) / torch.zeros(2))
        assert "rounds" not in cause.explanation and cause.fix.startswith("Guard the denominator")

    def test_the_inverse_of_a_probability_that_underflowed_is_a_division_by_zero_in_all_but_name(self):
        # Inverse-probability weights of a softmax whose smallest entry underflowed to a denormal.
        p = torch.softmax(torch.tensor([0.0, -93.0, 1.0]), 0)
        cause = cause_of(lambda: 1.0 / p)
        assert cause.id == "div_by_zero" and "all but name" in cause.title and "clamp_min" in cause.fix

    def test_near_miss_a_large_numerator_over_a_modest_divisor_is_an_overflow(self):
        cause = cause_of(lambda: torch.tensor([3e38, 1.0]) / torch.tensor([0.5, 2.0]))
        assert cause.id == "float_overflow"

    def test_masked_division_after_the_fact_leaks_into_the_gradient(self):
        pred = torch.nn.Parameter(torch.randn(6))
        target = torch.tensor([1.0, 0.0, 2.0, 0.0, 3.0, 1.0])
        cause = cause_of(train_steps(lambda: ((pred - target) / target)[target != 0].abs().mean(), [pred]))
        assert cause.id == "masked_inf_gradient_leak"
        assert "DivBackward0" in cause.explanation and "where" in cause.fix
        # Said of the script's own division: a zero gradient over the zero it divided by,
        # and a fix written for any numerator and denominator, not for names it lacks.
        assert "computes 0/0 = NaN" in cause.explanation
        assert "torch.where(keep, num / safe, 0)" in cause.fix and "pred" not in cause.fix

    def test_a_target_made_nan_while_preparing_data_is_the_division_not_the_leak(self):
        """Histogram targets normalised by their sum up front (one empty: 0/0), masked in
        the loss: the NaN leaks through backward, but the bug is the data's division."""
        counts = torch.tensor([[1.0, 3.0], [0.0, 0.0]])
        logits = torch.nn.Parameter(torch.zeros(2, 2))

        def run():
            target = counts / counts.sum(-1, keepdim=True)  # (before training: phase data)
            keep = target > 0
            safe = torch.where(keep, target, torch.ones_like(target))
            loss = torch.where(keep, target * (torch.log(safe) - torch.log_softmax(logits, -1)), 0.0).sum()
            opt = torch.optim.SGD([logits], lr=0.1)
            loss.backward()
            opt.step()

        cause = cause_of(run)
        assert cause.id == "div_by_zero"

    @staticmethod
    def _ratio_without_nans(safe: bool):
        """SI-SNR's projection onto the target, over the target's energy: 0/0 for a silent
        target, squared on the way to the loss, which keeps only the items that are not NaN
        (backward of the square multiplies by the NaN projection it saved)."""
        est = torch.nn.Parameter(torch.tensor([[1.0, 2.0], [0.5, -1.0]]))
        target = torch.tensor([[1.0, 1.0], [0.0, 0.0]])

        def loss():
            energy = target.pow(2).sum(-1, keepdim=True)
            projection = (est * target).sum(-1, keepdim=True) * target / (energy.clamp_min(1e-8) if safe else energy)
            power = projection.pow(2).sum(-1)
            return -power[~torch.isnan(power)].mean()

        return train_steps(loss, [est])

    def test_nans_filtered_out_by_a_boolean_index_leak_into_the_gradient(self):
        cause = cause_of(self._ratio_without_nans(safe=False))
        assert cause.id == "masked_inf_gradient_leak" and "`div`" in cause.explanation

    def test_near_miss_a_guarded_energy_leaves_nothing_to_filter(self):
        assert stays_clean(self._ratio_without_nans(safe=True))

    @staticmethod
    def _entropy_of_attention(safe: bool):
        """An attention entropy over the valid positions: p = 0 where padded."""
        scores = torch.nn.Parameter(torch.randn(2, 4))
        valid = torch.tensor([[True, True, True, False], [True, True, False, False]])

        def loss():
            p = scores.masked_fill(~valid, float("-inf")).softmax(-1)
            logp = torch.log(torch.where(valid, p, 1.0) if safe else p)
            return torch.where(valid, -p * logp, torch.zeros_like(p)).sum()

        return train_steps(loss, [scores])

    def test_log_of_zero_dropped_after_a_product_leaks_into_the_gradient(self):
        # The Inf from log(0) goes through a product before `where` drops it: backward of
        # the product multiplies by it, and the leak's root is still the log.
        cause = cause_of(self._entropy_of_attention(safe=False))
        assert cause.id == "masked_inf_gradient_leak" and "`log`" in cause.explanation
        assert "torch.log(torch.where(valid, p, 1.0))" in cause.fix  # the double where, written for log

    def test_a_log_of_zero_replaced_by_nan_to_num_leaks_into_the_gradient_as_a_masked_inf(self):
        # BCELoss's clamp at -100 written by hand: the forward is finite, log's backward is
        # 1/0 times the zero gradient nan_to_num gives the replaced position.
        logits = torch.nn.Parameter(torch.tensor([0.0, 200.0, -3.0]))
        y = torch.tensor([1.0, 0.0, 0.0])

        def bce():
            p = torch.sigmoid(logits)  # sigmoid(200) is exactly 1: log(1 - p) is log(0)
            return -(y * torch.nan_to_num(torch.log(p), neginf=-100.0)
                     + (1 - y) * torch.nan_to_num(torch.log(1 - p), neginf=-100.0)).mean()

        cause = cause_of(train_steps(bce, [logits]))
        assert cause.id == "masked_inf_gradient_leak" and "`log`" in cause.explanation

    def test_an_inf_a_grus_gates_saturate_on_is_the_division_that_made_it_not_a_mask(self, tmp_path):
        # A price of 0 makes a ratio of x/0; the GRU's in-place sigmoid_ and tanh_ turn it
        # into 1, so the loss stays finite and only the weights' gradient is NaN. Nothing of
        # the script's dropped the Inf: no mask to make safe. (As a user runs it: trace
        # first sees the gradient, then re-runs the script op by op.)
        (tmp_path / "returns.py").write_text(GRU_OVER_PRICE_RATIOS)
        report = run_nandoctor(["run", "returns.py"], tmp_path).report
        assert report["root"]["op"] == "aten.div.Tensor" and report["root"]["location"]["line"] == 8
        assert report["cause"]["id"] == "div_by_zero"

    def test_near_miss_class_centres_a_gather_leaves_out_still_leak_through_the_division(self):
        # A centre loss: each class's mean feature in the batch, 0/0 for a class absent from
        # it; `centres[labels]` never gathers those rows, but DivBackward0 is 0/0 for them.
        torch.manual_seed(0)
        feats = torch.nn.Parameter(torch.randn(6, 3))
        labels = torch.tensor([0, 0, 1, 1, 3, 3])  # class 2 absent

        def centre_loss():
            onehot = F.one_hot(labels, 4).float()
            centres = (onehot.t() @ feats) / onehot.sum(0).unsqueeze(1)
            return ((feats - centres[labels]) ** 2).sum(1).mean()

        cause = cause_of(train_steps(centre_loss, [feats]))
        assert cause.id == "masked_inf_gradient_leak"

    def test_an_inf_exp_makes_zero_of_is_the_log_that_made_it(self):
        # x ** w written as exp(w * log(x)), at x = 0: exp(-inf) = 0 in forward, 0 * -inf in backward.
        w = torch.nn.Parameter(torch.tensor([0.5, 1.0]))
        cause = cause_of(train_steps(lambda: torch.exp(w * torch.log(torch.tensor([0.0, 2.0]))).sum(), [w]))
        assert cause.id == "log_nonpositive" and "where" not in cause.fix  # it dropped nothing

    def test_near_miss_the_double_where_keeps_log_away_from_zero(self):
        assert stays_clean(self._entropy_of_attention(safe=True))


    def test_weight_norm_of_a_zero_initialised_weight_divides_by_its_zero_norm(self):
        from torch.nn.utils.parametrizations import weight_norm

        layer = torch.nn.Linear(3, 2)
        torch.nn.init.zeros_(layer.weight)  # "start the residual branch at zero"
        layer = weight_norm(layer)
        cause = cause_of(lambda: layer(torch.ones(1, 3)))
        assert cause.id == "div_by_zero" and "weight_norm" in cause.title and "`g`" in cause.fix

    def test_near_miss_weight_norm_with_its_magnitude_zeroed_is_clean(self):
        from torch.nn.utils.parametrizations import weight_norm

        layer = weight_norm(torch.nn.Linear(3, 2))
        with torch.no_grad():
            layer.parametrizations.weight.original0.zero_()  # g = 0: w = 0, defined
        assert stays_clean(lambda: layer(torch.ones(1, 3)))


class TestExpAndOverflow:
    def test_exp_above_88_in_float32(self):
        a = torch.nn.Parameter(torch.tensor([1000.0, 1.0]))
        cause = cause_of(lambda: (torch.rand(2) / torch.exp(a)).sum().backward())
        assert cause.id == "exp_overflow"
        assert "1000" in cause.explanation and "88.72" in cause.explanation

    @staticmethod
    def _gaussian_nll(lr: float):
        """A learned log-sigma through exp; the targets' scale (x10) and lr=2 blow the
        weights up in one step, and exp overflows on the next forward."""
        torch.manual_seed(0)
        net = torch.nn.Linear(4, 2)
        x = torch.randn(32, 4)
        y = x.sum(1) * 10

        def loss():
            out = net(x)
            sigma = torch.exp(out[:, 1])
            return (torch.log(sigma) + 0.5 * ((y - out[:, 0]) / sigma) ** 2).mean()

        return train_steps(loss, net.parameters(), steps=3, lr=lr)

    def test_exp_of_inputs_grown_huge_after_a_step_blames_the_learning_rate(self):
        cause = cause_of(self._gaussian_nll(lr=2.0))
        assert cause.id == "exp_overflow" and "learning rate is likely too large" in cause.explanation
        assert cause.fix.startswith("Lower the learning rate")

    def test_near_miss_exp_overflow_before_any_step_keeps_the_exp_advice(self):
        a = torch.nn.Parameter(torch.tensor([1e5, 1.0]))
        cause = cause_of(lambda: (torch.rand(2) / torch.exp(a)).sum().backward())
        assert "learning rate" not in cause.explanation and cause.fix.startswith("Subtract the max")

    def test_exp_in_float16_of_a_value_float32_holds_is_a_float16_overflow(self):
        a = torch.nn.Parameter(torch.tensor([12.0, 1.0], dtype=torch.float16))  # exp(12) > 65504
        cause = cause_of(lambda: (torch.rand(2, dtype=torch.float16) / torch.exp(a)).sum().backward())
        assert cause.id == "fp16_overflow" and "11.09" in cause.title and "finite in float32" in cause.explanation
        assert "x.float()" in cause.fix and "max=80" not in cause.fix

    def test_near_miss_exp_in_float16_past_float32s_range_too_is_an_exp_overflow(self):
        a = torch.nn.Parameter(torch.tensor([100.0, 1.0]))
        cause = cause_of(lambda: (torch.rand(2, dtype=torch.float16) / torch.exp(a.half())).sum().backward())
        assert cause.id == "exp_overflow" and "x.clamp(max=11)" in cause.fix

    def test_near_miss_exp_of_80_is_fine(self):
        assert stays_clean(lambda: torch.exp(torch.tensor([80.0])) / 2)

    def test_float16_product_past_65504(self):
        cause = cause_of(lambda: torch.full((4,), 300.0, dtype=torch.float16) * 300.0)
        assert cause.id == "fp16_overflow" and "bfloat16" in cause.fix
        assert "does not help here" in cause.fix  # a GradScaler scales gradients, not forward values

    def test_float16_attention_scores_past_65504_are_scaled_before_the_product(self):
        q = torch.full((1, 4, 8), 100.0, dtype=torch.float16)
        cause = cause_of(lambda: q @ q.transpose(1, 2))
        assert cause.id == "fp16_overflow" and "head_dim ** -0.5" in cause.fix

    def test_float16_gradients_past_65504_point_at_the_grad_scaler(self):
        w = torch.nn.Parameter(torch.full((4,), 1.0, dtype=torch.float16))
        cause = cause_of(lambda: ((w * 300.0).float().sum() * 1000.0).backward())  # 1000 * 300 in backward
        assert cause.id == "fp16_overflow" and "GradScaler`, whose scale backs off" in cause.fix

    def test_geometric_growth_is_an_exploding_gradient(self):
        torch.manual_seed(0)
        x = torch.rand(64, 1) * 3000
        y = 150 * x
        model = torch.nn.Linear(1, 1)
        cause = cause_of(train_steps(lambda: F.mse_loss(model(x), y), model.parameters(), steps=50, lr=1e-3))
        assert cause.id == "exploding_gradient"
        assert "clip_grad_norm_" in cause.fix and "→" in cause.explanation

    @staticmethod
    def _sgd_by_hand(lr: float):
        """`w -= lr * w.grad` under no_grad (as `sub_`: a closure cannot rebind `w`): no
        optimizer counts the steps."""
        torch.manual_seed(0)
        x = torch.randn(64, 3) * 100
        y = x @ torch.tensor([1.0, -2.0, 3.0])
        w = torch.zeros(3, requires_grad=True)

        def train():
            for _ in range(40):
                loss = ((x @ w - y) ** 2).mean()
                loss.backward()
                with torch.no_grad():
                    w.sub_(lr * w.grad)
                    w.grad.zero_()
            read_back(w)

        return train

    def test_a_loss_that_grows_in_an_update_loop_written_by_hand_is_an_exploding_gradient(self):
        cause = cause_of(self._sgd_by_hand(lr=0.5))
        assert cause.id == "exploding_gradient" and "backward passes" in cause.explanation

    def test_near_miss_the_same_loop_with_a_small_learning_rate_is_clean(self):
        assert stays_clean(self._sgd_by_hand(lr=1e-5))

    def test_a_cast_to_float16_of_values_past_its_range_is_said_to_be_the_cast(self):
        cause = cause_of(lambda: torch.tensor([8.5e4, 1.0]).half())  # a BatchNorm running_var in a .half() checkpoint
        assert cause.id == "fp16_overflow" and "cast" in cause.title and "float32 values" in cause.explanation

    def test_near_miss_float16_arithmetic_that_overflows_stays_an_overflow_of_the_op(self):
        cause = cause_of(lambda: torch.tensor([300.0], dtype=torch.float16) * 300)
        assert cause.id == "fp16_overflow" and "cast" not in cause.title and "device_type" in cause.fix

    def test_adam_on_float16_weights_says_its_eps_rounds_to_zero_there(self):
        w = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
        opt = torch.optim.Adam([w], lr=0.1)

        def step():
            (w * torch.tensor([1e-4, 1.0], dtype=torch.float16)).sum().backward()  # 1e-4 ** 2 is 0 in float16
            opt.step()

        cause = cause_of(step)
        assert cause.id == "optimizer_invalid" and "eps=1e-8 rounds to 0" in cause.explanation
        assert "GradScaler" in cause.fix

    def test_a_run_that_overflows_at_its_third_step_after_a_millionfold_jump_is_exploding(self):
        # Raw used-car features (km up to 200) and a learning rate fit for scaled ones: the loss
        # goes 3e8 -> 4e19 in one step and the next forward overflows; two finite losses only.
        torch.manual_seed(0)
        x = torch.cat([torch.rand(64, 1) * 200, torch.rand(64, 1) * 20, 900 + torch.rand(64, 1) * 2100], 1)
        y = 20_000 - 50 * x[:, :1] + 4 * x[:, 2:3]
        model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)

        def train():
            for _ in range(6):
                loss = ((model(x) - y) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()

        cause = cause_of(train)
        assert cause.id == "exploding_gradient" and "over the last 2 steps" in cause.explanation

    def test_a_noisy_divergence_that_ends_in_a_runaway_is_an_explosion(self):
        from nandoctor.diagnose.rules.fallback import growth

        # A large learning rate (a summed loss over accumulated micro-batches) bounces
        # before it runs away: the last steps of such a run.
        bouncing = [146.6, 497.9, 51.9, 825.2, 679.0, 354.2, 25446.6, 6.56e10]
        assert growth(bouncing) is not None

    def test_near_miss_a_loss_that_bounces_and_settles_is_no_explosion(self):
        from nandoctor.diagnose.rules.fallback import growth

        assert growth([146.6, 497.9, 51.9, 825.2, 679.0, 354.2, 2.5e4, 8.0e3]) is None  # (no runaway)
        assert growth([1.0, 3.0, 0.5, 2.0, 1.0, 0.8, 5.0, 40.0]) is None  # (rising at the end, 40x only)

    def test_a_steady_divergence_slower_than_the_window_sees_is_an_explosion(self):
        from nandoctor.diagnose.rules.fallback import growth

        # SGD a little past 2/L: the loss times 1.8 a step, 61x over any eight values.
        assert growth([12.0 * 1.8 ** step for step in range(64)]) is not None
        # A high constant SWA rate: a millionfold in three steps, then hovering near the top.
        hovering = [1.89, 2.2e4, 1.1e12, 1.9e35, 5e33, 4.5e36, 8e34, 2e36, 6e35, 3e36, 1e36, 4e36]
        assert growth(hovering) is not None

    def test_near_miss_a_long_history_that_only_jumps_at_its_end_or_wanders_is_no_explosion(self):
        from nandoctor.diagnose.rules.fallback import growth

        assert growth([5.0, 4.0, 6.0, 3.0, 5.0, 7.0, 2.0, 6.0] * 8) is None  # (noise about a level)
        # A bad batch's loss a millionfold above a level run: one step up, the rest level.
        assert growth([5.0, 4.0, 6.0, 3.0, 5.0, 7.0, 2.0, 6.0] * 8 + [1.0, 6e6]) is None

    def test_near_miss_two_losses_a_thousandfold_apart_are_no_explosion(self):
        from nandoctor.diagnose.rules.fallback import growth

        assert growth([1.0, 1e3]) is None and growth([3.2e8, 4.0e19]) is not None

    def test_near_miss_a_single_overflow_without_history_is_a_plain_overflow(self):
        a = torch.full((1, 2), 3e30, requires_grad=True)
        cause = cause_of(lambda: torch.mm(a, torch.full((2, 1), 3e30)).sum().backward())
        assert cause.id == "float_overflow"

    def test_atanh_at_one_is_a_singularity_not_an_overflow(self):
        # A tanh-squashed policy's clipped action (exactly 1.0) back through atanh: +inf in
        # any dtype, from an input of 1.
        cause = cause_of(lambda: torch.atanh(torch.tensor([0.5, 1.0])))
        assert cause.id == "singularity" and "atanh" in cause.explanation and "clamp" in cause.fix

    def test_near_miss_an_op_without_a_pole_that_overflows_stays_an_overflow(self):
        cause = cause_of(lambda: torch.tensor([10.0]) ** torch.tensor([40.0]))
        assert cause.id == "float_overflow"


def test_cosh_of_large_negative_residuals_overflows_as_exp_does():
    # A log-cosh loss whose residuals are all far below zero: cosh(-x) = cosh(x).
    residual = torch.tensor([-423.0, -283.0, -300.0], requires_grad=True)
    cause = cause_of(lambda: torch.log(torch.cosh(residual)).mean())
    assert cause.id == "exp_overflow" and "423" in cause.explanation and "softplus" in cause.fix


def test_near_miss_cosh_of_moderate_residuals_of_either_sign_is_clean():
    assert stays_clean(lambda: torch.log(torch.cosh(torch.tensor([-60.0, 60.0]))).mean())


def _layer_norm_by_hand_over_a_blank_row(norm: str = "layer"):
    """ConvNeXt's channels-first LayerNorm, written out with its own names and no eps (or an
    RMSNorm: no mean taken out, the root kept in a name; or an L2 normalisation: a sum of
    squares, no mean), over a row of zeros."""
    h = torch.randn(3, 4, requires_grad=True) * torch.tensor([[1.0], [0.0], [1.0]])

    def layer_norm():
        u = h.mean(-1, keepdim=True)
        s = (h - u).pow(2).mean(-1, keepdim=True)
        return ((h - u) / torch.sqrt(s)).sum()

    def rms_norm():
        rms = h.pow(2).mean(-1, keepdim=True).sqrt()
        return (h / rms * 2.0).sum()

    def l2_normalise():
        return (h / h.pow(2).sum(-1, keepdim=True).sqrt()).sum()

    return {"layer": layer_norm, "rms": rms_norm, "l2": l2_normalise}[norm]


def test_a_variance_written_out_under_any_name_is_a_zero_variance():
    cause = cause_of(_layer_norm_by_hand_over_a_blank_row())
    assert cause.id == "zero_variance"


def test_an_rms_norm_without_epsilon_is_a_zero_root_mean_square_as_its_rsqrt_spelling_is_zero_variance():
    cause = cause_of(_layer_norm_by_hand_over_a_blank_row("rms"))
    assert cause.id == "zero_variance" and "root mean square" in cause.title and "RMSNorm" in cause.fix
    h = torch.zeros(2, 4, requires_grad=True)
    assert cause_of(lambda: (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True))).sum()).id == "zero_variance"


def test_near_miss_a_vector_divided_by_its_length_is_a_plain_division_by_zero():
    assert cause_of(_layer_norm_by_hand_over_a_blank_row("l2")).id == "div_by_zero"


def test_a_variance_as_sums_of_squares_minus_a_squared_sum_is_a_zero_variance():
    # A negative-Pearson loss (rPPG) against a reference pulse that is flat: N*Σy² - (Σy)² = 0.
    preds = torch.randn(2, 16, requires_grad=True)
    labels = torch.stack([torch.randn(16), torch.zeros(16)])

    def neg_pearson():
        n = preds.shape[1]
        sum_x, sum_y = preds.sum(1), labels.sum(1)
        sum_x2, sum_y2, sum_xy = (preds ** 2).sum(1), (labels ** 2).sum(1), (preds * labels).sum(1)
        pearson = (n * sum_xy - sum_x * sum_y) / torch.sqrt((n * sum_x2 - torch.pow(sum_x, 2)) * (n * sum_y2 - torch.pow(sum_y, 2)))
        return (1 - pearson).mean()

    assert cause_of(neg_pearson).id == "zero_variance"


def test_near_miss_a_difference_of_squares_that_is_no_spread_is_a_division_by_zero():
    v = torch.tensor([0.5, 1.0], requires_grad=True)  # a speed at c: the Lorentz factor
    assert cause_of(lambda: (1 / torch.sqrt(1 - v ** 2)).sum()).id == "div_by_zero"


@pytest.mark.parametrize("eps, cause_id", [(0.0, "zero_variance"), (1e-5, None)])
def test_a_layer_norm_without_epsilon_over_zero_padded_frames_divides_by_a_zero_variance(eps, cause_id):
    frames = torch.randn(2, 5, 6)
    frames[:, 3:] = 0.0  # zero padding after each sequence's end
    norm = torch.nn.LayerNorm(6, eps=eps)
    if cause_id is None:  # near miss: the default epsilon keeps a constant frame at 0
        assert stays_clean(lambda: norm(frames))
    else:
        cause = cause_of(lambda: norm(frames))
        assert cause.id == cause_id and "without epsilon" in cause.title and "eps=1e-5" in cause.fix


class TestSpecialFunctions:
    def test_a_bessel_function_past_float32s_range_is_an_exp_overflow_fixed_in_log_space(self):
        # A von Mises NLL's normaliser log(2π I0(κ)) with a concentration fit to tight data.
        kappa = torch.tensor([2.0, 120.0], requires_grad=True)
        cause = cause_of(lambda: torch.log(2 * math.pi * torch.special.i0(kappa)).sum().backward())
        assert cause.id == "exp_overflow" and "i0e" in cause.fix and "VonMises" in cause.fix

    def test_near_miss_the_exponentially_scaled_form_stays_finite(self):
        kappa = torch.tensor([2.0, 120.0], requires_grad=True)
        assert not detect(lambda: (torch.log(torch.special.i0e(kappa)) + kappa).sum().backward()).stopped

    def test_svd_vectors_of_a_low_rank_matrix_have_an_undefined_gradient(self):
        # Orthogonal Procrustes through a layer that starts at zero: H is 0, its singular
        # values all equal. (A rank-1 H left two of them at 1e-7 and 1e-15 here: distinct,
        # and a finite gradient on some CPUs' LAPACK, a NaN on others'.)
        w = torch.nn.Parameter(torch.zeros(4, 3))

        def procrustes():
            a = torch.randn(8, 4)
            h = (a @ w).T @ a
            u, _, vh = torch.linalg.svd(h, full_matrices=False)
            (u @ vh).sum().backward()

        cause = cause_of(procrustes)
        assert cause.id == "div_by_zero" and "repeated singular values" in cause.title and "svdvals" in cause.fix

    def test_near_miss_svd_of_a_full_rank_matrix_has_a_finite_gradient(self):
        w = torch.nn.Parameter(torch.randn(4, 3))

        def procrustes():
            torch.manual_seed(0)
            a = torch.randn(8, 4)
            h = (a @ w).T @ a
            u, _, vh = torch.linalg.svd(h, full_matrices=False)
            (u @ vh).sum().backward()

        assert not detect(procrustes).stopped


class TestRootsAndDomains:
    def test_sqrt_of_a_negative(self):
        cause = cause_of(lambda: torch.sqrt(torch.tensor([4.0, -1.0])))
        assert cause.id == "sqrt_negative" and "-1" in cause.explanation

    def test_sqrt_of_zero_in_backward(self):
        p = torch.nn.Parameter(torch.tensor([[1.0, 1.0], [2.0, 2.0]]))
        cause = cause_of(lambda: torch.sqrt(((p - torch.tensor([[1.0, 1.0], [0.0, 0.0]])) ** 2).sum(1)).sum().backward())
        assert cause.id == "sqrt_zero_backward" and "1e-12" in cause.fix

    def test_near_miss_sqrt_with_epsilon_is_fine(self):
        p = torch.nn.Parameter(torch.tensor([[1.0, 1.0]]))
        assert stays_clean(lambda: torch.sqrt(((p - 1) ** 2).sum(1) + 1e-12).sum().backward())

    def test_acos_of_slightly_more_than_one(self):
        cause = cause_of(lambda: torch.acos(torch.tensor([0.5, 1.0000001])))
        assert cause.id == "domain_asin_acos" and "clamp" in cause.fix

    def test_acosh_just_below_one_says_so_with_its_own_domain_and_clamp(self):
        # A Lorentz distance of a point and itself: -<x, x> rounds to 0.99999988.
        cause = cause_of(lambda: torch.acosh(torch.tensor([2.0, 0.99999988])))
        assert cause.id == "domain_asin_acos" and "[1, inf)" in cause.explanation
        assert "0.9999998" in cause.explanation and "acosh(x.clamp_min(1 + 1e-6))" in cause.fix

    def test_acosh_at_one_in_backward_names_its_own_derivative(self):
        x = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
        cause = cause_of(lambda: torch.acosh(x).sum().backward())
        assert cause.id == "domain_asin_acos" and "1/sqrt(x²-1)" in cause.explanation and "acosh" in cause.fix

    def test_near_miss_acos_inside_the_domain(self):
        assert stays_clean(lambda: torch.acos(torch.tensor([-1.0, 0.0, 1.0])))

    def test_negative_base_to_a_fractional_power(self):
        cause = cause_of(lambda: torch.tensor([-8.0, 4.0]) ** 0.5)
        assert cause.id == "pow_invalid"

    def test_a_fractional_power_of_a_zero_norm_in_backward(self):
        p = torch.nn.Parameter(torch.zeros(3))
        cause = cause_of(lambda: (p.norm() ** 0.3).backward())
        assert cause.id == "pow_invalid" and "x ** p with p < 1" in cause.title

    def test_a_square_root_written_as_a_power_of_one_half_is_sqrt_zero_backward(self):
        # `(d2) ** 0.5` of keypoints that coincide: sqrt's gradient at 0, whatever its spelling.
        p = torch.nn.Parameter(torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
        cause = cause_of(lambda: ((p ** 2).sum(1) ** 0.5).sum().backward())
        assert cause.id == "sqrt_zero_backward"

    def test_a_focal_gamma_below_one_is_a_power_not_a_square_root(self):
        # `(1 - p) ** gamma` with gamma = 0.5 where a class is predicted with certainty: the
        # exponent is the script's setting, not a root it meant.
        p = torch.nn.Parameter(torch.tensor([1.0, 0.3]))
        gamma = 0.5
        cause = cause_of(lambda: ((1 - p) ** gamma).sum().backward())
        assert cause.id == "pow_invalid" and "x ** p with p < 1" in cause.title

    def test_hypot_at_the_origin_is_a_norm_of_zero(self):
        p = torch.nn.Parameter(torch.tensor([0.0, 3.0]))
        cause = cause_of(lambda: torch.hypot(p, p * 0).sum().backward())
        assert cause.id == "norm_zero_backward"

    def test_near_miss_hypot_away_from_the_origin(self):
        p = torch.nn.Parameter(torch.tensor([1.0, 3.0]))
        assert stays_clean(lambda: torch.hypot(p, p * 0).sum().backward())

    def test_near_miss_norm_of_a_zero_vector_alone_has_a_finite_gradient(self):
        p = torch.nn.Parameter(torch.zeros(3))
        assert stays_clean(lambda: torch.linalg.vector_norm(p).backward())


class TestContext:
    def test_ctc_names_the_impossible_items(self):
        T, N, C = 6, 2, 5
        log_probs = torch.randn(T, N, C).log_softmax(-1).requires_grad_()
        targets = torch.tensor([1, 2, 1, 2, 3, 4, 1, 2, 3])
        cause = cause_of(lambda: F.ctc_loss(log_probs, targets, torch.tensor([6, 6]), torch.tensor([2, 7])).backward())
        assert cause.id == "ctc_infeasible"
        assert "item 1 (6 frames for 7 labels" in cause.explanation and "zero_infinity=True" in cause.fix

    def test_near_miss_ctc_with_zero_infinity_is_clean(self):
        log_probs = torch.randn(6, 1, 5).log_softmax(-1).requires_grad_()
        assert stays_clean(lambda: F.ctc_loss(log_probs, torch.tensor([1, 2, 3, 4, 1, 2, 3]), torch.tensor([6]),
                                              torch.tensor([7]), zero_infinity=True).backward())

    @pytest.mark.parametrize("loss", [
        lambda logits, y: F.cross_entropy(logits, y),
        lambda logits, y: torch.nn.CrossEntropyLoss()(logits, y),
        lambda logits, y: F.nll_loss(logits.log_softmax(-1), y),
    ])
    def test_a_mean_loss_whose_every_target_is_ignored_is_zero_over_zero(self, loss):
        logits = torch.randn(4, 5, requires_grad=True)
        cause = cause_of(lambda: loss(logits, torch.full((4,), -100)).backward())
        assert cause.id == "div_by_zero" and "ignore_index" in cause.title
        assert "every target is -100" in cause.explanation

    def test_near_miss_a_batch_with_one_counted_target_is_clean(self):
        logits = torch.randn(4, 5, requires_grad=True)
        assert stays_clean(lambda: F.cross_entropy(logits, torch.tensor([-100, -100, 3, -100])).backward())

    @pytest.mark.parametrize("mean", [
        lambda ce, labels: ce[labels == 4].mean(),  # a class absent from the batch
        lambda ce, labels: ce[labels == 4].mean(dim=0),
        lambda ce, labels: torch.stack([ce[labels == c].mean() for c in range(5)]).mean(),
    ])
    def test_a_mean_over_an_empty_selection_is_zero_over_zero(self, mean):
        ce = torch.rand(6, requires_grad=True)
        labels = torch.tensor([0, 1, 2, 3, 0, 1])
        cause = cause_of(lambda: mean(ce, labels).backward())
        assert cause.id == "div_by_zero" and "empty selection" in cause.title and "mask.any()" in cause.fix

    @pytest.mark.parametrize("loss", [F.mse_loss, F.smooth_l1_loss, F.huber_loss, F.binary_cross_entropy_with_logits,
                                      lambda p, y: F.binary_cross_entropy(torch.sigmoid(p), y)])
    def test_a_loss_averaging_over_an_empty_selection_is_zero_over_zero(self, loss):
        pred, target = torch.randn(6, requires_grad=True), torch.rand(6)
        keep = target > 2.0  # nothing kept
        cause = cause_of(lambda: loss(pred[keep], target[keep]).backward())
        assert cause.id == "div_by_zero" and "empty selection" in cause.title and "reduction='mean'" in cause.explanation

    def test_near_miss_a_summed_loss_over_an_empty_selection_is_clean(self):
        pred, target = torch.randn(6, requires_grad=True), torch.rand(6)
        keep = target > 2.0
        assert stays_clean(lambda: F.mse_loss(pred[keep], target[keep], reduction="sum").backward())

    def test_near_miss_a_mean_over_a_selection_that_picked_something_is_clean(self):
        ce = torch.rand(6, requires_grad=True)
        assert stays_clean(lambda: ce[torch.tensor([0, 1, 2, 3, 4, 1]) == 4].mean().backward())

    @pytest.mark.parametrize("spread", [
        lambda h: h.std(0),
        lambda h: torch.var(h, dim=0),
        lambda h: torch.std_mean(h, dim=0)[0],
        lambda h: h.var(0, unbiased=True),
        lambda h: h[:, :1].var(),
    ])
    def test_a_spread_over_one_value_has_no_degrees_of_freedom(self, spread):
        h = torch.randn(1, 4, requires_grad=True)
        cause = cause_of(lambda: ((h - h.mean(0)) / spread(h)).sum())
        assert cause.id == "div_by_zero" and "no degrees of freedom" in cause.title
        assert "correction=1" in cause.explanation and "drop_last=True" in cause.fix

    def test_a_spread_per_group_prepared_up_front_over_one_row_is_a_group_of_one_not_a_short_batch(self):
        # Per-subject z-scores computed before training: one subject has a single recording.
        x, subject = torch.randn(5, 3), torch.tensor([0, 0, 1, 1, 2])

        def standardise():
            for s in range(3):
                g = x[subject == s]
                x[subject == s] = (g - g.mean(dim=0)) / g.std(dim=0)
            return x

        cause = cause_of(standardise)
        assert "a group with a single row" in cause.explanation and "drop_last" not in cause.fix

    def test_a_weights_spread_over_a_fan_in_of_one_is_no_batch_of_one(self):
        w = torch.nn.Parameter(torch.randn(4, 1))  # weight standardisation of a 1-input layer
        cause = cause_of(lambda: (w - w.mean(1, keepdim=True)) / (w.std(1, keepdim=True) + 1e-5))
        assert "a weight's" in cause.explanation and "drop_last" not in cause.fix and "correction=0" in cause.fix

    def test_near_miss_the_population_spread_of_one_value_is_zero_not_nan(self):
        h = torch.randn(1, 4)
        assert stays_clean(lambda: h.std(0, correction=0))

    def test_near_miss_a_spread_over_two_values_is_fine(self):
        h = torch.randn(2, 4)
        assert stays_clean(lambda: (h - h.mean(0)) / h.std(0))

    def test_an_inf_sentinel_in_the_loss_is_a_value_written_on_purpose_not_data(self):
        w = torch.randn(3, requires_grad=True)
        cause = cause_of(lambda: (w.pow(2).mean() * torch.tensor(float("inf"))).backward())
        assert cause.id == "mask_value_used" and "sentinel" in cause.title

    def test_a_log_of_a_softmax_whose_zeros_nll_never_picks_is_a_log_of_zero_fixed_by_log_softmax(self):
        # The hand-written cross-entropy: its NaN gradient leaks through the zeros nll_loss
        # leaves out, but no mask of the script's dropped them: the bug is the log of 0.
        logits = torch.nn.Parameter(torch.tensor([[120.0, 0.0, 1.0]]))  # softmax underflows to 0 at class 1
        cause = cause_of(lambda: F.nll_loss(torch.log(torch.softmax(logits, -1)), torch.tensor([0])).backward())
        assert cause.id == "log_nonpositive" and "F.log_softmax" in cause.fix and "double" not in cause.fix

    def test_nan_data_a_mask_drops_after_the_fact_is_input_data_whose_gradient_leaks(self):
        # Missing targets (NaN) dropped from the loss with a boolean mask after the error is
        # computed: the gradient is NaN, and what to fix is the data's NaN, filled first.
        w = torch.nn.Parameter(torch.tensor([0.5]))

        def train():
            y = torch.tensor([1.0, float("nan"), 3.0])
            err = (w * 2 - y) ** 2
            err[~torch.isnan(y)].mean().backward()

        cause = cause_of(train)
        assert cause.id == "nonfinite_input_data" and "backward still runs through them" in cause.explanation
        assert "torch.where(valid, y, 0.0)" in cause.fix

    @staticmethod
    def _replay_buffer(sample_filled_only: bool):
        """A replay buffer whose empty slots hold a NaN placeholder, sampled for a batch."""
        layer = torch.nn.Linear(3, 1)
        filled = 3 if sample_filled_only else 8

        def train():
            buffer = torch.full((8, 3), float("nan"))
            buffer[:3] = torch.randn(3, 3)
            layer(buffer[torch.arange(filled)]).sum().backward()

        return train

    def test_a_nan_placeholder_that_reaches_the_model_is_a_value_written_on_purpose_used(self):
        cause = cause_of(self._replay_buffer(sample_filled_only=False))
        assert cause.id == "mask_value_used" and "placeholder" in cause.title
        assert "torch.full((8, 3)" in cause.explanation and "Inf" not in cause.explanation

    def test_near_miss_a_buffer_sampled_from_its_filled_slots_only_is_clean(self):
        assert stays_clean(self._replay_buffer(sample_filled_only=True))

    @staticmethod
    def online_logsumexp(scores: torch.Tensor, chunk: int) -> torch.Tensor:
        """logsumexp chunk by chunk, as flash attention does: a running max from -inf."""
        m = torch.tensor([float("-inf")] * scores.shape[0])
        s = torch.zeros(scores.shape[0])
        for part in scores.split(chunk, dim=1):
            m_new = torch.maximum(m, part.max(dim=1).values)
            s = s * torch.exp(m - m_new) + torch.exp(part - m_new[:, None]).sum(1)
            m = m_new
        return m + s.log()

    def test_a_running_max_still_at_minus_inf_minus_itself_is_inf_arithmetic(self):
        mask = torch.zeros(3, 6, dtype=torch.bool)
        mask[1, :3] = True  # row 1's first chunk is fully masked: -inf - (-inf)
        cause = cause_of(lambda: self.online_logsumexp(torch.randn(3, 6).masked_fill(mask, float("-inf")), 3))
        assert cause.id == "inf_arithmetic" and "sub" in cause.explanation
        assert 'torch.tensor([float("-inf")]' in cause.explanation  # where the -inf was written

    def test_a_zero_one_mask_multiplied_by_minus_inf_says_to_select_instead(self):
        # Older BERT code: (1 - allowed) * -10000.0, written with -inf: 0 * -inf = NaN.
        allowed = torch.tril(torch.ones(4, 4))
        cause = cause_of(lambda: (1.0 - allowed) * float("-inf"))
        assert cause.id == "inf_arithmetic" and cause.title == "a mask multiplied by an infinity"
        assert "torch.where(allowed, 0.0, float('-inf'))" in cause.fix

    @pytest.mark.parametrize("term", [
        # soft-target cross entropy: a probability of 0 on an illegal move whose logit is -inf
        lambda: torch.tensor([[0.7, 0.3, 0.0]]) * torch.log_softmax(
            torch.tensor([[1.0, 0.5, float("-inf")]]), -1),
        # a transport plan of 0 on a forbidden cell whose cost is +inf
        lambda: torch.tensor([[0.5, 0.0], [0.0, 0.5]]) * torch.tensor([[1.0, float("inf")], [float("inf"), 2.0]]),
    ])
    def test_zero_weights_on_infinite_values_are_dropped_not_multiplied(self, term):
        cause = cause_of(term)
        assert cause.id == "inf_arithmetic" and cause.title == "zero weights multiplied by infinite values"
        assert "torch.where(w > 0, w * v, 0.0)" in cause.fix and "additive mask" not in cause.explanation

    @staticmethod
    def _half_entropy_of_masked_logits(top_logit: float):
        """A float16 policy's entropy, unavailable actions masked with float16's minimum,
        finite: log_softmax subtracts the row's max, which takes -65504 past the range when
        the top logit is above about 16."""
        logits = torch.nn.Parameter(torch.tensor([[top_logit, 1.0, 0.0]], dtype=torch.float16))
        keep = torch.tensor([[True, True, False]])
        logp = F.log_softmax(logits.masked_fill(~keep, torch.finfo(torch.float16).min), -1)
        entropy = -(logp.exp() * logp).sum()
        entropy.float().backward()
        read_back(entropy)

    def test_a_finite_mask_log_softmax_takes_past_float16s_range_is_that_overflow(self):
        result = detect(reading(lambda: self._half_entropy_of_masked_logits(20.0)))
        assert result.stopped and result.detection.root.op == "aten._log_softmax.default"  # not the 0 * -inf after
        cause = cause_of(lambda: self._half_entropy_of_masked_logits(20.0))
        assert cause.id == "fp16_overflow" and "finfo(torch.float16).min" in cause.explanation
        assert "logits.float()" in cause.fix and "entr" in cause.fix

    def test_near_miss_a_top_logit_that_keeps_the_mask_in_range_is_clean(self):
        assert stays_clean(lambda: self._half_entropy_of_masked_logits(3.0))

    @staticmethod
    def _choose_among_unvisited(visited_every_city: bool):
        """A pointer network's decoding step: visited cities masked with -inf."""
        from torch.distributions import Categorical

        torch.manual_seed(0)
        visited = torch.zeros(4, 5, dtype=torch.bool)
        visited[:, :3] = True
        if visited_every_city:
            visited[0] = True  # one step past the end of the tour
        logits = torch.randn(4, 5).masked_fill(visited, float("-inf"))
        return Categorical(logits=logits, validate_args=False).entropy()  # (validating raises over the NaN)

    def test_a_categorical_over_a_row_with_nothing_left_to_choose_is_minus_inf_minus_itself(self):
        cause = cause_of(lambda: self._choose_among_unvisited(visited_every_city=True))
        assert cause.id == "inf_arithmetic" and "logsumexp that is -inf itself" in cause.title
        assert "only hides the NaN" in cause.fix

    def test_near_miss_a_categorical_with_a_city_left_in_every_row_is_clean(self):
        assert stays_clean(lambda: self._choose_among_unvisited(visited_every_city=False))

    def test_near_miss_a_running_max_that_starts_at_minus_inf_is_clean(self):
        mask = torch.zeros(3, 6, dtype=torch.bool)
        mask[1, :2] = True  # masked, but every chunk keeps a value
        assert stays_clean(lambda: self.online_logsumexp(torch.randn(3, 6).masked_fill(mask, float("-inf")), 3))

    def test_logdet_of_a_negative_determinant_is_a_log_of_a_non_positive_value(self):
        a = torch.nn.Parameter(torch.diag(torch.tensor([1.0, -2.0, 3.0])))
        cause = cause_of(lambda: torch.logdet(a).backward())
        assert cause.id == "log_nonpositive" and "slogdet" in cause.fix

    def test_logdet_of_a_singular_matrix_is_rooted_at_slogdet_not_at_the_nan_torch_drops(self):
        # logdet builds a NaN for negative determinants on every call and a `where` keeps
        # slogdet's -inf for this one, whose determinant is 0 (a repeated row).
        v = torch.nn.Parameter(torch.tensor([[1.0, 2.0], [1.0, 2.0], [0.5, 0.1]]))
        result = detect(reading(lambda: torch.logdet(v @ v.T)))
        assert result.detection.root.op == "aten._linalg_slogdet.default"
        cause = cause_of(lambda: torch.logdet(v @ v.T))
        assert cause.id == "log_nonpositive" and "singular" in cause.title

    def test_near_miss_logdet_of_a_positive_definite_matrix_is_clean(self):
        a = torch.nn.Parameter(torch.diag(torch.tensor([1.0, 2.0, 3.0])))
        assert stays_clean(lambda: torch.logdet(a).backward())

    def test_a_non_finite_batch_is_input_data(self):
        data = torch.randn(8, 3)
        data[5, 0] = float("inf")
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=4)
        cause = cause_of(lambda: torch.cat([b for (b,) in loader]))
        assert cause.id == "nonfinite_input_data"
        assert "batch 1" in cause.explanation and "[5]" in cause.explanation

    def test_a_nan_from_numpy_is_input_data(self):
        import numpy as np

        x = torch.from_numpy(np.array([1.0, np.nan], dtype=np.float32))
        cause = cause_of(lambda: torch.nn.Linear(2, 1)(x))
        assert cause.id == "nonfinite_input_data"

    def test_a_loaded_nan_parameter_is_named(self):
        model = torch.nn.Linear(2, 1)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        state["weight"][0, 0] = float("nan")
        cause = cause_of(lambda: model.load_state_dict(state))
        assert cause.id == "nonfinite_parameter"

    def test_a_loaded_nan_buffer_is_named_as_a_buffer(self):
        # A checkpoint whose BatchNorm running_var holds a NaN: eval outputs NaN, training not.
        model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
        state = {k: v.clone() for k, v in model.state_dict().items()}
        state["1.running_var"][2] = float("nan")
        cause = cause_of(lambda: model.load_state_dict(state))
        assert cause.id == "nonfinite_parameter" and cause.title == "a buffer was already non-finite"
        assert "Buffer `1.running_var` holds" in cause.explanation

    @staticmethod
    def _deep_mlp_after_updates(lr: float, steps: int = 3):
        torch.manual_seed(0)
        layers = [torch.nn.Linear(16, 16) for _ in range(12)]
        model = torch.nn.Sequential(*layers)
        x = torch.randn(8, 16)
        return train_steps(lambda: model(x).pow(2).mean(), model.parameters(), steps=steps, lr=lr,
                           opt_cls=torch.optim.Adam)

    def test_a_learning_rate_orders_of_magnitude_off_blows_up_in_one_update(self):
        # lr=300 for 3e-2: one Adam step moves each weight by ~300, and the next forward
        # overflows float32 on its way through 12 layers. Two losses are too few for a series.
        cause = cause_of(self._deep_mlp_after_updates(lr=300.0))
        assert cause.id == "exploding_gradient" and "learning rate" in cause.title

    def test_near_miss_a_sane_learning_rate_trains_on(self):
        assert stays_clean(self._deep_mlp_after_updates(lr=1e-3))

    def test_adam_with_zero_eps_is_an_invalid_optimizer(self):
        w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
        cause = cause_of(train_steps(lambda: (w[0] * 3), [w], opt_cls=torch.optim.Adam, lr=0.1, eps=0.0))
        assert cause.id == "optimizer_invalid" and "eps" in cause.fix

    def test_a_division_in_the_scripts_step_hook_is_that_division_not_an_optimizer_setting(self, tmp_path):
        # A projection onto the simplex after each step (a Keras weight constraint does the
        # same inside its optimizer): a column with no positive weight left sums to 0.
        (tmp_path / "simplex.py").write_text(SIMPLEX_STEP_HOOK)
        report = run_nandoctor(["run", "simplex.py"], tmp_path).report
        assert report["root"]["phase"] == "optimizer" and report["root"]["location"]["line"] == 10
        assert report["cause"]["id"] == "div_by_zero" and "hyper-parameters" not in report["cause"]["fix"]

    def test_a_division_by_zero_in_an_optimizer_the_script_wrote_is_that_division(self, tmp_path):
        # The step runs unwatched; the seeded replay finds the op inside the script's own step().
        (tmp_path / "lars.py").write_text(LARS_BY_HAND)
        report = run_nandoctor(["run", "lars.py"], tmp_path).report
        assert report["root"]["phase"] == "optimizer" and report["root"]["location"]["line"] == 10
        assert report["cause"]["id"] == "div_by_zero"

    def test_rsqrt_of_a_zero_second_moment_in_an_optimizer_the_script_wrote_is_no_variance(self, tmp_path):
        (tmp_path / "rmsprop.py").write_text(RMSPROP_BY_HAND)
        report = run_nandoctor(["run", "rmsprop.py"], tmp_path).report
        assert report["root"]["op"] == "aten.rsqrt.default" and report["root"]["location"]["line"] == 11
        assert report["cause"]["id"] == "div_by_zero" and "second moment" in report["cause"]["title"]

    def test_addcdiv_by_a_zero_root_in_an_optimizer_the_script_wrote_is_that_division(self, tmp_path):
        (tmp_path / "adagrad.py").write_text(ADAGRAD_BY_HAND)
        report = run_nandoctor(["run", "adagrad.py"], tmp_path).report
        assert report["root"]["op"] == "aten.addcdiv_.default" and report["root"]["location"]["line"] == 11
        assert report["cause"]["id"] == "div_by_zero" and "eps" in report["cause"]["fix"]

    def test_softmax_over_a_fully_masked_row_is_inf_arithmetic(self):
        scores = torch.randn(2, 3)
        mask = torch.tensor([[False, True, True], [True, True, True]])
        cause = cause_of(lambda: torch.softmax(scores.masked_fill(mask, float("-inf")), -1))
        assert cause.id == "inf_arithmetic"

    @staticmethod
    def _encoder_in_eval(left_padding: bool, boolean_masks: bool):
        """nn.TransformerEncoderLayer's fused eval path under a causal mask: a left pad
        position attends to padding only."""
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
        causal = torch.nn.Transformer.generate_square_subsequent_mask(4)
        pad = torch.tensor([[left_padding, False, False, not left_padding], [False] * 4])
        if boolean_masks:
            causal = causal.isinf()
        else:
            pad = torch.zeros(2, 4).masked_fill(pad, float("-inf"))
        with torch.no_grad():
            return layer(torch.randn(2, 4, 8), src_mask=causal, src_key_padding_mask=pad).mean()

    @pytest.mark.parametrize("boolean_masks", [True, False])
    def test_a_fused_attention_whose_query_has_no_key_left_is_a_fully_masked_row(self, boolean_masks):
        cause = cause_of(lambda: self._encoder_in_eval(left_padding=True, boolean_masks=boolean_masks))
        assert cause.id == "inf_arithmetic" and "every key is masked" in cause.title
        assert "pad on the right" in cause.fix and "finfo" not in cause.fix.split(".")[0]

    def test_near_miss_right_padding_under_the_same_causal_mask_is_clean(self):
        assert stays_clean(lambda: self._encoder_in_eval(left_padding=False, boolean_masks=False))


def test_logsumexp_backward_over_an_all_minus_inf_row_is_rooted_in_backward():
    s = torch.nn.Parameter(torch.randn(3, 4))
    allowed = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 1.0]])
    result = detect(lambda: torch.logsumexp(s + torch.log(allowed), -1)[1:].sum().backward())
    root = result.detection.root
    assert root.phase == "backward" and root.backward_node == "LogsumexpBackward0"
    cause = cause_of(lambda: torch.logsumexp(s + torch.log(allowed), -1)[1:].sum().backward())
    assert cause.id == "inf_arithmetic" and "The Inf was written at" in cause.explanation


def test_near_miss_logsumexp_over_rows_that_keep_a_finite_entry_is_clean():
    s = torch.nn.Parameter(torch.randn(3, 4))
    allowed = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 1.0]])
    assert stays_clean(lambda: torch.logsumexp(s + torch.log(allowed), -1).sum().backward())


def test_an_inf_written_by_a_seen_op_is_never_said_to_come_from_outside():
    scores = torch.randn(2, 3)
    mask = torch.tensor([[True, True, True], [False, True, False]])
    masked = cause_of(lambda: torch.softmax(scores.masked_fill(mask, float("-inf")), -1))
    assert "came from outside" not in masked.explanation


def test_a_nan_built_from_python_numbers_among_finite_ones_is_input_data():
    cause = cause_of(lambda: torch.tensor([2.0, float("nan")]).mul(1))  # a missing measurement
    assert cause.id == "nonfinite_input_data" and "outside torch" in cause.explanation


def test_near_miss_a_lone_nan_typed_as_a_placeholder_and_used_as_a_number_is_the_placeholder_used():
    cause = cause_of(lambda: torch.tensor([float("nan")]).mul(1))
    assert cause.id == "mask_value_used" and "placeholder" in cause.title


def test_unknown_lists_what_was_checked():
    finite = TensorSummary("self", (2,), "float32", 0.5, 2.0, 0, 0, 0, 0, 0, 2)
    out = TensorSummary("output", (2,), "float32", None, None, 2, 0, 0, 0, 0, 2)
    root = Site("aten.special_op.default", "forward", Location("t.py", 3, "<module>", "y = f(x)"),
                output=out, inputs=[finite])
    cause = cause_of_root(root)
    assert cause.id == "unknown"
    assert "aten.special_op.default" in cause.explanation and "self: zeros=0" in cause.explanation


@pytest.mark.parametrize("nan, words", [(1, "made NaN"), (0, "passed the Inf on")])
def test_inf_arithmetic_says_whether_the_op_made_nan_or_passed_the_inf_on(nan, words):
    inf_in = TensorSummary("src", (1,), "float32", None, None, 0, 0, 1, 0, 1, 1)
    out = TensorSummary("output", (1,), "float32", None, None, nan, 0, 1 - nan, 0, 1 - nan, 1)
    root = Site("aten.copy_.default", "init", Location("t.py", 5, "f", "c[i] = x"), output=out, inputs=[inf_in],
                facts=SiteFacts(inf_written_at=Location("t.py", 4, "f", "x = best")))
    cause = cause_of_root(root)
    assert cause.id == "inf_arithmetic" and words in cause.explanation


class TestBackwardRulesTorchNowMasks:
    """torch 2.13 gives atan2(0, 0) and the norm of a zero vector a zero gradient, so no
    real run reaches these rules there; older releases (and other ops' formulas) do. The
    rules are checked on the evidence such a run produces."""

    @staticmethod
    def backward_root(node: str | None, code: str, op: str = "aten.div.Tensor") -> Site:
        out = TensorSummary("output", (4,), "float32", 0.0, 0.0, 2, 0, 0, 2, 0, 4)
        return Site(op, "backward" if node else "forward", Location("train.py", 7, "<module>", code),
                    backward_node=node, output=out)

    def test_atan2_backward_at_the_origin(self):
        cause = cause_of_root(self.backward_root("Atan2Backward0", "heading = torch.atan2(v[:, 1], v[:, 0])"))
        assert cause.id == "atan2_zero_backward" and "train.py:7" in cause.explanation

    def test_norm_backward_of_a_zero_vector(self):
        cause = cause_of_root(self.backward_root("LinalgVectorNormBackward0", "n = torch.linalg.vector_norm(d, dim=1)"))
        assert cause.id == "norm_zero_backward" and "F.normalize" in cause.fix

    def test_the_norm_rule_is_keyed_on_every_norm_node_torch_builds(self):
        # x.norm(), torch.norm(x, dim=0), vector_norm and the Frobenius norm all build this node.
        x = torch.rand(3, requires_grad=True)
        nodes = {type(f(x).grad_fn).__name__ for f in (torch.norm, torch.linalg.vector_norm,
                                                       lambda t: torch.norm(t.view(1, 3), p="fro"))}
        assert nodes == {"LinalgVectorNormBackward0"}
        assert cause_of_root(self.backward_root(nodes.pop(), "n = x.norm()")).id == "norm_zero_backward"

    def test_near_miss_a_forward_atan2_root_is_not_a_backward_cause(self):
        cause = cause_of_root(self.backward_root(None, "x", op="aten.atan2.default"))
        assert cause.id != "atan2_zero_backward"


def test_a_nan_copied_into_a_parameter_no_module_owns_is_described_by_its_shape():
    w = torch.nn.Parameter(torch.ones(3))
    source = torch.tensor([1.0, 5.0, 2.0])
    source.numpy()[1] = float("nan")  # written behind torch's back, as a loader's buffer would be

    def load():
        with torch.no_grad():
            w.copy_(source)

    cause = cause_of(load)
    assert cause.id == "nonfinite_parameter"
    assert cause.explanation.startswith("A parameter of shape (3,) holds 1 NaN (of 3)")


class TestCausalMaskDiagonal:
    """A causal mask written with `triu` and the default diagonal=0 masks each position's
    own score too: the first query attends to nothing, and its softmax row is 0/0."""

    @staticmethod
    def _attend(mask):
        w = torch.nn.Parameter(torch.randn(4, 4))
        return lambda: torch.softmax(w + mask(), -1).sum()

    def test_a_triu_mask_that_keeps_the_diagonal_masked_is_named_with_its_fix(self):
        cause = cause_of(self._attend(lambda: torch.triu(torch.full((4, 4), float("-inf")))))
        assert cause.id == "inf_arithmetic" and "diagonal=1" in cause.explanation and "diagonal=1" in cause.fix

    @pytest.mark.parametrize("mask", [
        lambda: torch.triu(torch.full((4, 4), float("-inf")), diagonal=1),
        lambda: torch.triu(torch.full((4, 4), float("-inf")), 1),
        lambda: torch.full((4, 4), float("-inf")).triu(1),
    ])
    def test_near_miss_a_mask_above_the_diagonal_is_clean(self, mask):
        assert stays_clean(self._attend(mask))

    @staticmethod
    def _attend_batch(hide, padding=None):
        """Scores of a batch of 3 sequences of 4, a bool mask built on its own line (True = hide)
        and applied on the next, as most attention code is written."""
        w = torch.nn.Parameter(torch.randn(3, 4, 4))

        def attend():
            hidden = hide | (padding if padding is not None else torch.zeros(3, 4, 4, dtype=torch.bool))
            scores = w.masked_fill(hidden, float("-inf"))
            return torch.softmax(scores, -1).sum()

        return attend

    def test_a_diagonal_hiding_mask_is_named_from_the_rows_it_empties_not_the_line_that_built_it(self):
        cause = cause_of(self._attend_batch(torch.ones(4, 4, dtype=torch.bool).triu()))
        assert "row 0" in cause.explanation and "diagonal=1" in cause.fix

    def test_a_mask_that_hides_the_past_is_named_as_the_masks_own_shape(self):
        cause = cause_of(self._attend_batch(torch.ones(4, 4, dtype=torch.bool).tril()))
        assert "same query rows (3)" in cause.explanation and "diagonal=1" in cause.fix

    def test_near_miss_padding_that_empties_different_rows_per_sequence_keeps_the_padding_advice(self):
        causal = torch.ones(4, 4, dtype=torch.bool).triu(1)
        padding = torch.zeros(3, 4, 4, dtype=torch.bool)
        padding[1, 0, :] = True  # the second sequence's first query is padding with a query-side mask
        cause = cause_of(self._attend_batch(causal, padding))
        assert cause.id == "inf_arithmetic" and "entirely -inf" in cause.title
        assert "row 0" not in cause.explanation and "same query rows" not in cause.explanation
        assert "diagonal=1" not in cause.fix and "all-padding" in cause.fix


class TestMaskValueUsed:
    def test_a_minus_inf_mask_summed_into_the_loss_is_inf_arithmetic_at_the_sum(self):
        # The mask is fine where it is written; the sum over masked positions is what to change.
        w = torch.nn.Parameter(torch.randn(4, 4))
        causal = torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)
        cause = cause_of(lambda: w.masked_fill(causal, float("-inf")).sum().backward())
        assert cause.id == "inf_arithmetic" and "summed" in cause.title
        assert "torch.finfo" in cause.fix and "unmasked" in cause.fix

    def test_label_smoothing_over_a_masked_vocabulary_is_the_cross_entropy_summing_the_mask(self):
        logits = torch.nn.Parameter(torch.randn(6, 5))
        allowed = torch.tensor([True, True, True, False, False])
        masked = lambda: logits.masked_fill(~allowed, float("-inf"))  # noqa: E731
        cause = cause_of(lambda: F.cross_entropy(masked(), torch.tensor([0, 1, 2, 0, 1, 2]),
                                                 label_smoothing=0.1).backward())
        assert cause.id == "inf_arithmetic" and "label_smoothing" in cause.explanation

    def test_near_miss_the_same_masked_vocabulary_without_smoothing_trains(self):
        logits = torch.nn.Parameter(torch.randn(6, 5))
        allowed = torch.tensor([True, True, True, False, False])
        assert stays_clean(lambda: F.cross_entropy(logits.masked_fill(~allowed, float("-inf")),
                                                   torch.tensor([0, 1, 2, 0, 1, 2])).backward())

    def test_a_mask_that_reaches_the_loss_without_a_sum_is_a_mask_used_as_a_number(self):
        w = torch.nn.Parameter(torch.randn(4, 4))
        causal = torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)
        cause = cause_of(lambda: w.masked_fill(causal, float("-inf"))[0, 3].backward())
        assert cause.id == "mask_value_used" and "torch.finfo" in cause.fix

    def test_an_inf_torch_writes_inside_a_function_is_its_value_by_definition_not_a_mask(self):
        # KL(q || prior) where the pruned prior gives code 2 probability 0 and q does not:
        # torch.distributions writes +inf there itself.
        from torch.distributions import Categorical, kl_divergence

        logits = torch.nn.Parameter(torch.zeros(3))
        prior = Categorical(probs=torch.tensor([0.5, 0.5, 0.0]))
        cause = cause_of(lambda: kl_divergence(Categorical(logits=logits), prior).backward())
        assert cause.id == "mask_value_used" and "by definition" in cause.title
        assert "finfo" not in cause.fix

    def test_a_mask_added_to_the_scores_and_summed_is_the_same_cause(self):
        w = torch.nn.Parameter(torch.randn(4, 4))
        causal = torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)
        cause = cause_of(lambda: (w + torch.zeros(4, 4).masked_fill(causal, float("-inf"))).sum().backward())
        assert cause.id == "inf_arithmetic" and "summed" in cause.title

    @staticmethod
    def _forbidden_transitions():
        allowed = torch.zeros(3, 3)
        allowed[0, 2] = float("-inf")  # tag 0 never goes to tag 2 (a CRF's hard constraint)
        return allowed

    def test_a_constraint_matrix_written_entry_by_entry_is_a_mask_on_a_path_that_uses_it(self):
        w = torch.nn.Parameter(torch.randn(3, 3))
        # a gold path through a forbidden transition
        cause = cause_of(lambda: -(w + self._forbidden_transitions())[0, 2].backward())
        assert cause.id == "mask_value_used" and "(a mask)" in cause.title and "best-so-far" not in cause.explanation

    def test_near_miss_an_inf_written_into_a_table_of_values_is_data_not_a_mask(self):
        w = torch.nn.Parameter(torch.randn(3))

        def corrupted():
            x = torch.randn(4, 3)
            x[2, 1] = float("inf")  # MARK-corrupt: a bad record in the table
            (x @ w).sum().backward()

        cause = cause_of(corrupted)
        assert cause.id == "nonfinite_input_data" and "x[2, 1]" in cause.explanation

    def test_near_miss_the_constraint_matrix_under_logsumexp_is_clean(self):
        w = torch.nn.Parameter(torch.randn(3, 3))
        assert stays_clean(lambda: torch.logsumexp(w + self._forbidden_transitions(), dim=1).sum().backward())

    def test_near_miss_the_constraint_matrix_kept_as_a_buffer_is_clean_in_the_state_dict(self):
        def save():
            crf = torch.nn.Module()
            crf.register_buffer("allowed", self._forbidden_transitions())
            return crf.state_dict()["allowed"]

        assert stays_clean(save)

    def test_near_miss_a_mask_added_to_the_scores_before_softmax_is_clean(self):
        w = torch.nn.Parameter(torch.randn(4, 4))
        causal = torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)
        assert stays_clean(lambda: torch.softmax(w + torch.zeros(4, 4).masked_fill(causal, float("-inf")), -1).sum().backward())

    def test_a_fully_masked_row_after_adding_the_mask_is_the_softmax_own_cause(self):
        scores = torch.randn(2, 3)
        padding = torch.tensor([[False, True, True], [True, True, True]])
        cause = cause_of(lambda: torch.softmax(scores + torch.zeros(2, 3).masked_fill(padding, float("-inf")), -1))
        assert cause.id == "inf_arithmetic" and "entirely -inf" in cause.title

    def test_a_softmax_over_distances_masked_with_plus_inf_is_not_a_fully_masked_row(self):
        dist = torch.rand(3, 4)
        cause = cause_of(lambda: torch.softmax(dist.masked_fill(torch.tensor([True, False, False, False]), float("inf")), -1))
        assert cause.id == "inf_arithmetic" and "+inf" in cause.title and "(-dist)" in cause.fix


def test_a_rule_that_raises_costs_the_report_nothing_but_that_rule(monkeypatch):
    from nandoctor.diagnose import registry

    def broken_rule(ev):
        raise AttributeError("'Site' object has no attribute 'parents'")

    monkeypatch.setattr(registry, "_context_rules", [broken_rule, *registry._context_rules])
    cause = cause_of(lambda: torch.log(torch.zeros(2)))
    assert cause.id == "log_nonpositive"  # the next rules still name it


def test_near_miss_when_no_other_rule_applies_the_failure_is_told_as_a_bug():
    from nandoctor.diagnose import registry

    def broken_rule(ev):
        raise KeyError("inputs")

    site = Site(op="aten.mystery.default", phase="forward", location=None, module=None, backward_node=None,
                inputs=[], output=summarize(torch.tensor([float("nan")]), "out"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(registry, "_context_rules", [broken_rule])
        patch.setattr(registry, "_fallback_rules", [])
        cause = cause_of_root(site)
    assert cause.id == "unknown" and "`broken_rule` raised KeyError" in cause.explanation


def _dropped_then_leaked(op: str, inputs: list[TensorSummary]) -> Site:
    """A root whose non-finite output the script dropped in forward (an ignored target, a
    mask) and whose gradient then leaked NaN through `LogSoftmaxBackward0`."""
    out = TensorSummary("output", (2, 4), "float32", 0.1, 0.9, 4, 0, 0, 0, 0, 8)
    facts = SiteFacts(masked=True, gradient_leak_through="LogSoftmaxBackward0")
    return Site(op=op, phase="forward", location=Location("t.py", 3, "forward", "att = F.softmax(att, -1)"),
                inputs=inputs, output=out, facts=facts)


def test_a_softmax_over_a_fully_masked_row_whose_nan_leaked_is_still_the_row_with_nothing():
    scores = TensorSummary("self", (2, 4), "float32", -1.0, 1.0, 0, 0, 6, 0, 1, 8)  # 6 -inf: one row all masked
    cause = cause_of_root(_dropped_then_leaked("aten._softmax.default", [scores]))
    assert cause.id == "inf_arithmetic" and "entirely -inf" in cause.title


def test_near_miss_a_log_whose_masked_inf_leaked_is_the_gradient_leak():
    zeros = TensorSummary("self", (2, 4), "float32", 0.0, 1.0, 0, 0, 0, 2, 0, 8)
    cause = cause_of_root(_dropped_then_leaked("aten.log.default", [zeros]))
    assert cause.id == "masked_inf_gradient_leak"



def test_a_non_finite_learning_rate_is_named_as_the_setting_with_the_schedule_fix():
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = torch.optim.SGD([w], lr=0.1)

    def run():
        for it in range(3):
            opt.param_groups[0]["lr"] = float(torch.tensor(1 - it / 1).pow(0.5))  # NaN from it = 2
            (w * w).sum().backward()
            opt.step()

    cause = cause_of(run)
    assert cause.id == "optimizer_invalid" and "`lr` is non-finite" in cause.title
    assert "max_iter" in cause.fix and "eps=0" not in cause.explanation


def test_an_empty_mask_over_its_own_max_is_said_to_divide_by_all_zeros():
    mask = torch.zeros(4)
    cause = cause_of(lambda: mask / mask.max())
    assert cause.id == "div_by_zero" and "all zeros" in cause.explanation


def test_near_miss_a_single_zero_divisor_is_not_given_the_empty_mask_example():
    # A gradient norm divided by (a scalar that is 0): no mask in sight.
    grad = torch.randn(3)
    cause = cause_of(lambda: grad / torch.zeros(()))
    assert cause.id == "div_by_zero" and "empty mask" not in cause.explanation


def _overflow_at_step_81_after(losses):
    """A Linear that overflows at step 81 on inputs of 1.6e33, after the `losses` of the
    steps before it (the history a run keeps)."""
    from nandoctor.detect.result import History

    huge = TensorSummary("mat1", (4, 8), "float32", -1.6e33, 1.6e33, 0, 0, 0, 0, 16, 32)
    out = TensorSummary("output", (4, 2), "float32", None, None, 0, 8, 0, 0, 0, 8)
    root = Site("aten.addmm.default", "forward", Location("train.py", 30, "forward", "return self.fc(x)"),
                output=out, inputs=[huge], step=81)
    history = History(list(range(81 - len(losses), 81)), losses, [None] * len(losses))
    return build_report("train.py", exit_code=3, detection=Detection(StopReason.OP_MADE_INF, root, root, [root]),
                        step=81, history=history).cause


def test_an_overflow_long_after_a_divergence_the_loss_seemed_to_recover_from_is_exploding():
    # StepLR(gamma=10): the loss spiked at step 78, came back down, the weights stayed huge.
    cause = _overflow_at_step_81_after([0.11, 0.10, 0.12, 5.6e20, 300.0, 160.0])
    assert cause.id == "exploding_gradient" and "spiked to 5.600e+20 at step 78" in cause.explanation
    assert "gamma" in cause.fix


def test_near_miss_the_same_overflow_after_a_steady_loss_is_no_divergence():
    assert _overflow_at_step_81_after([0.11, 0.10, 0.12, 0.11, 0.10, 0.09]).id != "exploding_gradient"
