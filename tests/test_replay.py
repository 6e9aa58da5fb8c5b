"""The seeded replay's state: a documented JSON file, read once and taken out of the environment."""
from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers import run_nandoctor
from nandoctor import replay
from nandoctor.errors import UsageError


def draws():
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_the_random_state_written_as_json_restores_every_generator(tmp_path, monkeypatch):
    torch.manual_seed(3), np.random.seed(3), random.seed(3)
    path = tmp_path / "state.json"
    replay.save_state(replay.RngState.capture(), path)
    expected = draws()
    data = json.loads(path.read_text())
    assert data["schema"] == "nandoctor.replay/1" and set(data["rng"]) == {"python", "numpy", "torch_cpu", "torch_cuda"}

    monkeypatch.setenv(replay.STATE_ENV, str(path))
    state = replay.take_state_from_environment()
    assert replay.STATE_ENV not in __import__("os").environ  # the script's own subprocesses never see it
    state.restore()
    assert draws() == expected


def test_no_replay_state_outside_a_replay(monkeypatch):
    monkeypatch.delenv(replay.STATE_ENV, raising=False)
    assert replay.take_state_from_environment() is None


@pytest.mark.parametrize("text", ["not json", '{"schema": "nandoctor.replay/0", "rng": {}}', '{"schema": "nandoctor.replay/1"}'])
def test_a_bad_replay_state_is_one_clear_error(tmp_path, monkeypatch, text):
    path = tmp_path / "state.json"
    path.write_text(text)
    monkeypatch.setenv(replay.STATE_ENV, str(path))
    with pytest.raises(UsageError, match="cannot read the replay state"):
        replay.take_state_from_environment()


SEES_ENV = """\
import os
import torch
torch.manual_seed(0)
w = torch.nn.Parameter(torch.ones(2))
opt = torch.optim.SGD([w], lr=0.1)
if os.environ.get("NANDOCTOR_REPLAY"):
    with open("replay_env.txt", "w") as f:
        f.write(",".join(sorted(k for k in os.environ if k.startswith("NANDOCTOR"))))
for step in range(3):
    opt.zero_grad()
    x = torch.tensor([1.0, float("nan") if step == 1 else 2.0])
    (w * x).sum().backward()
    opt.step()
"""


def test_a_watch_replay_runs_with_nandoctor_replay_set_and_the_state_variable_already_taken(tmp_path, script):
    script("train.py", SEES_ENV)
    result = run_nandoctor(["run", "--mode", "watch", "train.py"], tmp_path)
    assert result.code == 3 and result.report["reproduced"] is True
    assert (tmp_path / "replay_env.txt").read_text() == "NANDOCTOR_REPLAY"


READS_STDIN = """\
import sys
import torch
scale = float(sys.stdin.readline())
w = torch.nn.Parameter(torch.ones(3))
opt = torch.optim.SGD([w], lr=0.1)
for step in range(4):
    loss = (w * 2).sum()
    if step == 2:
        loss = loss / scale  # MARK-div
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _watch_with_stdin(tmp_path, stdin, input_text=None):
    """A real process (the fork server's stdin is /dev/null), its standard input as given."""
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "nandoctor", "run", "--mode", "watch", "--json", str(report),
                           "train.py"], cwd=tmp_path, stdin=stdin, input=input_text, capture_output=True,
                          text=True, timeout=180)
    return proc, json.loads(report.read_text())


class TestTheReplayReadsTheFirstRunsInput:
    """A script that reads its standard input gets the same input in its replay where the
    input can be read twice: a file, from the offset the first run started at. A pipe
    cannot: a replay that dies of the missing input says so, and blames no nondeterminism."""

    def test_a_file_on_stdin_is_read_again_from_where_the_first_run_began(self, tmp_path, script):
        script("train.py", READS_STDIN)
        (tmp_path / "in.txt").write_text("skip\n0\n")
        with open(tmp_path / "in.txt") as stdin:
            stdin.readline()  # (a shell read the first line before nandoctor started)
            stdin.seek(len("skip\n"))
            proc, report = _watch_with_stdin(tmp_path, stdin)
        assert proc.returncode == 3 and report["reproduced"] is True, proc.stderr
        assert report["cause"]["id"] == "div_by_zero" and report["root"]["location"]["line"] == 9

    def test_near_miss_a_pipe_cannot_be_read_twice_and_the_report_says_the_replay_died_of_it(self, tmp_path, script):
        script("train.py", READS_STDIN)
        proc, report = _watch_with_stdin(tmp_path, None, input_text="0\n")
        assert proc.returncode == 3 and report["reproduced"] is None
        cause = report["cause"]
        assert cause["id"] == "unknown" and "died of the script's own error" in cause["explanation"]
        assert "could not convert string to float" in cause["explanation"] and "a pipe" in cause["explanation"]
        assert "nondeterminism" not in cause["explanation"] and "< input.txt" in cause["fix"]
