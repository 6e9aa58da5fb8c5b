"""torch.distributed runs (distributed.py, cli/launcher.py): 2 ranks with gloo on CPU, as a
user launches them (`nandoctor run --nproc-per-node 2`, which goes through torchrun).

One rank's bad batch names that rank as the culprit and the other as stopped by it; a bug
every rank hits says so; a healthy run ends with the same numbers as without nandoctor;
nothing hangs (every launch has a deadline well under the backend's timeouts).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "sample_scripts" / "distributed" / "ddp_regression.py"
DEADLINE_S = 90

pytestmark = pytest.mark.distributed


def _launch(tmp_path: Path, *options: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "nandoctor", "run", "--nproc-per-node", "2", "--json", str(tmp_path / "r.json"),
         "--rank-reports", *options, str(SCRIPT)],
        cwd=tmp_path, capture_output=True, text=True, timeout=DEADLINE_S, stdin=subprocess.DEVNULL,
        env=dict(os.environ, OMP_NUM_THREADS="1", **env))
    return proc, time.monotonic() - started


def _report(tmp_path: Path, name: str = "r.json") -> dict:
    return json.loads((tmp_path / name).read_text())


@pytest.mark.parametrize("mode", ["trace", "watch"])
def test_one_ranks_bad_batch_names_that_rank_its_step_and_sample(tmp_path, mode):
    proc, elapsed = _launch(tmp_path, "--mode", mode, BAD_INDEX="55")
    assert proc.returncode == 3, proc.stderr[-3000:]
    report = _report(tmp_path)
    dist = report["distributed"]
    assert (dist["rank"], dist["culprit_rank"], dist["ranks_nonfinite"], dist["world_size"]) == (1, 1, [1], 2)
    assert report["step"] == 3 and report["root"]["phase"] == "data"
    assert report["root"]["facts"]["dataset_indices"] == [55]
    assert report["cause"]["id"] == "nonfinite_input_data"
    assert "rank 0: stopped: rank 1 found a non-finite value at step 3" in proc.stderr
    assert proc.stderr.count("╭─ nandoctor") == 1  # the report is printed once, by the culprit
    rank0 = _report(tmp_path, "r.rank0.json")
    assert rank0["distributed"]["culprit_rank"] == 1 and rank0["exit_code"] == 3
    assert elapsed < 60


def test_a_bug_every_rank_hits_is_reported_as_such(tmp_path):
    proc, _ = _launch(tmp_path, LOG_ZERO="1")
    assert proc.returncode == 3, proc.stderr[-3000:]
    report = _report(tmp_path)
    assert report["distributed"]["ranks_nonfinite"] == [0, 1]
    assert report["root"]["op"] == "aten.log.default" and report["cause"]["id"] == "log_nonpositive"
    assert Path(report["root"]["location"]["file"]).name == SCRIPT.name
    assert any("every rank" in note for note in report["notes"])


def test_a_healthy_run_is_clean_with_the_same_numbers_as_plain_torchrun(tmp_path):
    plain = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(SCRIPT)],
                           cwd=tmp_path, capture_output=True, text=True, timeout=DEADLINE_S, stdin=subprocess.DEVNULL,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert plain.returncode == 0, plain.stderr[-2000:]
    proc, _ = _launch(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == plain.stdout and "final" in proc.stdout  # rank 0's final parameter sum
    report = _report(tmp_path)
    assert report["status"] == "clean" and report["distributed"]["culprit_rank"] is None


def test_fsdp2_is_watched_the_same_way(tmp_path):
    script = SCRIPT.with_name("fsdp2_regression.py")
    proc = subprocess.run(
        [sys.executable, "-m", "nandoctor", "run", "--nproc-per-node", "2", "--json", str(tmp_path / "r.json"),
         str(script)],
        cwd=tmp_path, capture_output=True, text=True, timeout=DEADLINE_S, stdin=subprocess.DEVNULL,
        env=dict(os.environ, OMP_NUM_THREADS="1", BAD="1"))
    assert proc.returncode == 3, proc.stderr[-3000:]
    report = _report(tmp_path)
    assert report["distributed"]["culprit_rank"] == 1 and report["step"] == 3
    assert report["root"]["location"]["line"] == 21  # x[0, 0] = float("nan")


def test_a_peer_that_dies_is_told_apart_from_a_finding(tmp_path):
    proc, elapsed = _launch(tmp_path, DIE_AT="2")
    assert proc.returncode == 1, proc.stderr[-3000:]  # the script's error, as without nandoctor
    report = _report(tmp_path)
    assert report["status"] == "script_error" and report["distributed"]["culprit_rank"] is None
    assert any("another rank's process is gone" in note for note in report["notes"])
    assert elapsed < 60
