"""Where numpy made a non-finite value (numpy_warnings.py): the line numpy warned at, when
the array then enters torch, rather than the line that wrapped it."""
from __future__ import annotations

import warnings

import numpy as np
import torch

from helpers import detect, read_back, run_nandoctor
from nandoctor.diagnose import build_report


def _log_features(silenced: bool = False):
    counts = np.array([[3.0, 0.0], [2.0, 5.0]], dtype=np.float32)
    with np.errstate(divide="ignore") if silenced else warnings.catch_warnings():
        if not silenced:
            warnings.simplefilter("always")  # (shown again however often the test runs)
        features = np.log(counts)  # MARK-numpy
    read_back(torch.from_numpy(features) + 1)  # MARK-wrap (used: data only looked at is no stop)


def _line(marker: str) -> int:
    source = open(__file__).read().splitlines()
    return next(i for i, text in enumerate(source, 1) if f"# {marker}" in text and "def " not in text)


def test_a_value_numpy_made_is_found_at_the_line_numpy_warned_at():
    result = detect(_log_features)
    root = result.detection.root
    assert result.stopped and root.location.line == _line("MARK-numpy")
    assert root.facts.made_by_numpy == "divide by zero encountered in log"


def test_near_miss_with_numpy_silenced_the_line_that_wrapped_it_is_all_there_is():
    result = detect(lambda: _log_features(silenced=True))
    root = result.detection.root
    assert result.stopped and root.location.line == _line("MARK-wrap") and root.facts.made_by_numpy is None


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
