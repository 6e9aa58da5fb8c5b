"""Where numpy made a non-finite value (numpy_warnings.py): the line numpy warned at, when
the array then enters torch, rather than the line that wrapped it."""
from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pytest
import torch

from helpers import detect, line_in, read_back, run_nandoctor
from nandoctor.diagnose import build_report


def _log_features(silenced=None):
    """log of counts with a zero among them, then into torch. `silenced`: how the script
    keeps numpy's warning from showing, if it does."""
    counts = np.array([[3.0, 0.0], [2.0, 5.0]], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # (shown again however often the test runs)
        if silenced == "filter":
            warnings.simplefilter("ignore", RuntimeWarning)
        with np.errstate(divide="ignore") if silenced == "errstate" else contextlib.nullcontext():
            features = np.log(counts)  # MARK-numpy
    read_back(torch.from_numpy(features) + 1)  # MARK-wrap (used: data only looked at is no stop)


def _line(marker: str) -> int:
    return line_in(__file__, marker)


def test_a_value_numpy_made_is_found_at_the_line_numpy_warned_at():
    result = detect(_log_features)
    root = result.detection.root
    assert result.stopped and root.location.line == _line("MARK-numpy")
    assert root.facts.made_by_numpy == "divide by zero encountered in log"


@pytest.mark.parametrize("silenced", ["filter", "errstate"])
def test_numpy_silenced_by_the_script_still_names_its_line(silenced):
    with warnings.catch_warnings(record=True) as shown:
        result = detect(lambda: _log_features(silenced))
    root = result.detection.root
    assert result.stopped and root.location.line == _line("MARK-numpy")
    assert root.facts.made_by_numpy == "divide by zero encountered in log"
    assert not [w for w in shown if issubclass(w.category, RuntimeWarning)]  # still silent to the script


def test_near_miss_numpy_silenced_for_the_whole_script_leaves_the_line_that_wrapped_it():
    previous = np.seterr(divide="ignore")  # (np.seterr is not seen through: see the module)
    try:
        root = detect(_log_features).detection.root
    finally:
        np.seterr(**previous)
    assert root.location.line == _line("MARK-wrap") and root.facts.made_by_numpy is None


def test_near_miss_a_librarys_own_silenced_nan_is_not_the_scripts_line():
    library = {"np": np}  # a library's helper that makes and handles NaN inside errstate, as pandas does
    exec(compile("def nanmean(a):\n    with np.errstate(invalid='ignore'):\n        return np.divide(a, a)\n",
                 "/opt/lib/site-packages/tablelib/ops.py", "exec"), library)

    def script():
        library["nanmean"](np.zeros(2))
        read_back(torch.from_numpy(np.array([1.0, np.nan])) + 1)  # MARK-read

    root = detect(script).detection.root
    assert root.location.line == _line("MARK-read") and root.facts.made_by_numpy is None


@pytest.mark.parametrize("silenced", [None, "filter", "errstate"])
def test_a_mean_of_an_empty_selection_is_found_at_the_scripts_line_not_inside_numpy(silenced):
    # numpy's own Python code (`_methods._mean`) divides by the count 0 for the line.
    def user_means():
        ratings, users = np.array([4.0, 5.0, 3.0]), np.array([0, 0, 1])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore" if silenced == "filter" else "always")
            with np.errstate(invalid="ignore") if silenced == "errstate" else contextlib.nullcontext():
                means = np.array([ratings[users == u].mean() for u in range(3)])  # MARK-mean
        read_back(torch.from_numpy(means) + 1)

    result = detect(user_means)
    root = result.detection.root
    assert root.location.line == _line("MARK-mean") and "divide" in root.facts.made_by_numpy
    cause = build_report("t.py", exit_code=3, detection=result.detection, step=None,
                         history=result.detector.history()).cause
    assert cause.id == "div_by_zero" and "0/0 or inf/inf" in cause.explanation  # (numpy's NaN of a division)


def test_errstate_is_numpys_own_and_the_scripts_callback_is_kept():
    calls = []

    def script():
        with np.errstate(divide="call", call=lambda kind, flag: calls.append(kind)):
            np.log(np.zeros(1))

    errstate, filters = np.errstate, list(warnings.filters)
    detect(script)
    assert calls == ["divide by zero"]
    assert np.errstate is errstate and warnings.filters == filters  # all as it was once the run ends


def test_a_filter_the_script_adds_stays_behind_the_one_that_reads_warnings():
    seen = []

    def script():
        warnings.simplefilter("ignore", RuntimeWarning)
        seen.append(warnings.filters[1][0])
        np.log(np.zeros(1))

    with warnings.catch_warnings():
        detect(script)
    assert seen == ["ignore"]


def _standardised_log(zero_variance_column: bool):
    """log of counts, then standardised per column: the column holding log(0) = -inf turns
    to NaN at `x - x.mean()` (inf - inf); a column of one value turns to NaN at `/ x.std()`
    (0/0), after an Inf was made."""
    counts = np.array([[1.0, 0.0], [1.0, 5.0]]) if zero_variance_column else np.array([[2.0, 0.0], [1.0, 5.0]])
    with np.errstate(all="ignore"):
        logs = np.log(counts)  # MARK-log
        centred = logs - logs.mean(0)  # MARK-centre
        scaled = centred / centred.std(0)  # MARK-scale
    read_back(torch.from_numpy(scaled) + 1)


def test_a_nan_only_an_infinity_can_make_is_found_where_numpy_made_the_infinity():
    root = detect(lambda: _standardised_log(zero_variance_column=False)).detection.root
    assert root.location.line == _line("MARK-log") and root.facts.made_by_numpy == "divide by zero encountered in log"


def test_near_miss_a_nan_finite_values_make_is_its_own_lines():
    root = detect(lambda: _standardised_log(zero_variance_column=True)).detection.root
    assert root.location.line == _line("MARK-scale") and root.facts.made_by_numpy == "invalid value encountered in divide"


def test_near_miss_a_warning_of_an_inf_says_nothing_of_a_nan_read_from_elsewhere():
    def later_nan():
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            np.log(np.zeros(2))  # an Inf numpy made and the script dropped
        read_back(torch.from_numpy(np.array([1.0, np.nan])) + 1)  # MARK-file

    root = detect(later_nan).detection.root
    assert root.location.line == _line("MARK-file") and root.facts.made_by_numpy is None


def test_the_script_still_sees_numpys_warning_once_and_the_report_names_its_line(tmp_path):
    (tmp_path / "features.py").write_text(
        "import numpy as np\nimport torch\n"
        "raw = np.array([[1.0, 0.0], [2.0, 3.0]], dtype=np.float32)\n"
        "feats = np.log(raw)\n"
        "x = torch.from_numpy(feats)\n"
        "w = torch.nn.Parameter(torch.ones(2, 1))\n"
        "(x @ w).pow(2).mean().backward()\n")
    result = run_nandoctor(["run", "features.py"], tmp_path)
    assert result.code == 3 and result.report["root"]["location"]["line"] == 4
    assert result.report["root"]["op"] == ""  # no torch op ran at numpy's line (lift_fresh came after)
    assert result.report["cause"]["id"] == "log_nonpositive"  # what numpy did, as the same torch op
    assert result.stderr.count("RuntimeWarning: divide by zero encountered in log") == 1


class _MasksNormalisedByTheirMax(torch.utils.data.Dataset):
    """Segmentation masks scaled to [0, 1] by their max in numpy, warnings silenced as a
    notebook silences them; mask 2 is all black: 0/0."""

    def __len__(self):
        return 4

    def __getitem__(self, index):
        mask = np.ones((2, 2), np.float32) * (index != 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mask = mask / mask.max()  # MARK-silenced
        return torch.from_numpy(mask)


def test_a_sample_fetched_again_is_found_where_numpy_made_it_however_warnings_are_filtered():
    def train():
        for batch in torch.utils.data.DataLoader(_MasksNormalisedByTheirMax(), batch_size=2):
            read_back(batch)

    result = detect(train)
    root = result.detection.root
    assert result.stopped and root.location.line == _line("MARK-silenced") and root.phase == "data"
    cause = build_report("t.py", exit_code=3, detection=result.detection, step=None,
                         history=result.detector.history()).cause
    assert cause.id == "div_by_zero" and "numpy" in cause.title
    assert np.geterrcall() is None and np.geterr()["invalid"] == "warn"  # numpy's state is the script's again
