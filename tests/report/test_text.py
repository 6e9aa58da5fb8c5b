"""The plain-text pieces every format shares: counts in words, paths that fit a width."""
from __future__ import annotations

import pytest

from nandoctor.report.model import Discarded, Location
from nandoctor.report.text import discarded_summary, fit_location, plural, shorten_path, steps_done, times


def test_counts_agree_with_their_nouns():
    assert plural(1, "optimizer step") == "1 optimizer step"
    assert plural(0, "optimizer step") == "0 optimizer steps"
    assert plural(1234, "label") == "1,234 labels"
    assert plural(2, "batch", "batches") == "2 batches"
    assert (times(1), times(2), times(12)) == ("once", "twice", "12 times")
    assert steps_done(1) == "after 1 optimizer step" and steps_done(25) == "after 25 optimizer steps"


@pytest.mark.parametrize("width, expected", [
    (100, "experiments/sweep/run-12/deep/train.py:42"),
    (30, "…/run-12/deep/train.py:42"),
    (20, "…/deep/train.py:42"),
    (14, "…/train.py:42"),
    (8, "…n.py:42"),  # even the name does not fit: its end, and the line
])
def test_a_location_is_shortened_from_the_left_and_keeps_its_line(width, expected):
    location = Location("experiments/sweep/run-12/deep/train.py", 42, "f", "")
    assert fit_location(location, width) == expected
    assert len(fit_location(location, width)) <= max(width, len(":42") + 2)


def test_a_short_path_is_left_alone():
    assert shorten_path("train.py", 80) == "train.py"


def test_what_a_clean_run_discarded_in_one_phrase():
    at = Location("train.py", 27, "<module>", "")
    assert discarded_summary([]) == ""
    assert discarded_summary([Discarded("aten.log.default", at, "inf", 2)]) == (
        "Inf made twice and discarded before it changed a parameter, "
        "at train.py:27 (aten.log.default)")
    assert discarded_summary([Discarded("", None, "nan", 1)]) == (
        "NaN made once and discarded before it changed a parameter, "
        "in a value entering torch")
