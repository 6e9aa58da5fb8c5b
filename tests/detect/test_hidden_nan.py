"""Integers a cast made of NaN (hidden_nan.py): followed to where they are used, or left
out with the mask the script took before the cast."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from helpers import detect
from nandoctor.detect.result import StopReason


def _semi_supervised(use_of_targets: str):
    """Labels as floats, NaN for "unlabelled"; cast to class indices (`y.long()` makes
    -2**63 of NaN) and used as `use_of_targets` says: "masked" (the labelled rows only),
    "sliced_then_masked" (a view first), "unmasked" (every row), "embedded" (as indices into
    a table)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 4)
    table = torch.nn.Embedding(4, 4)
    x = torch.randn(8, 3)

    def train():
        y = torch.tensor([0.0, float("nan"), 2.0, 1.0, float("nan"), 3.0, 0.0, 1.0])  # (read in, as a script does)
        opt = torch.optim.SGD([*model.parameters(), *table.parameters()], lr=0.1)
        for _ in range(2):
            logits = model(x)
            labelled = ~torch.isnan(y)
            target = y.long()  # MARK-cast
            if use_of_targets == "masked":
                loss = F.cross_entropy(logits[labelled], target[labelled])
            elif use_of_targets == "sliced_then_masked":
                loss = F.cross_entropy(logits[:6][labelled[:6]], target[:6][labelled[:6]])
            elif use_of_targets == "unmasked":
                loss = F.cross_entropy(logits, target)
            else:
                loss = (logits * table(target)).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    return train


def test_integers_made_of_nan_and_left_out_by_the_scripts_mask_are_never_used():
    assert not detect(_semi_supervised("masked")).stopped


def test_they_are_followed_through_views_before_the_mask():
    assert not detect(_semi_supervised("sliced_then_masked")).stopped


def test_near_miss_every_row_given_to_the_loss_stops_before_it_raises_over_the_label():
    result = detect(_semi_supervised("unmasked"))
    assert result.stopped and result.detection.reason is StopReason.NAN_HIDDEN
    assert result.detection.hidden_by == "aten._to_copy"
    assert result.detection.event.op == "aten.lift_fresh.default"  # the NaN itself, as it entered


def test_near_miss_the_integers_used_as_indices_stop_the_run():
    result = detect(_semi_supervised("embedded"))
    assert result.stopped and result.detection.reason is StopReason.NAN_HIDDEN


def test_a_cast_whose_nan_the_script_never_touches_again_is_no_stop():
    def cast_and_drop():
        counts = torch.tensor([1.0, float("nan")]) * 2  # MARK-made
        _ = counts.long()

    assert not detect(cast_and_drop).stopped
