"""The benchmarks run with one command each (here with tiny loops: timings are measured by
running the benchmarks themselves, never asserted in a test)."""
from __future__ import annotations

import subprocess
import sys

from helpers import REPO


def run_bench(*args: str) -> str:
    proc = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_overhead_bench_prints_a_row_per_model_with_a_ratio_per_checker():
    out = run_bench("bench/bench_overhead.py", "--rounds", "1", "--steps", "2", "--models", "mlp")
    row = next(line for line in out.splitlines() if line.startswith("mlp"))
    assert row.count("x (") == 3  # detect_anomaly, trace, watch: paired ratio (fastest-run ratio)


def test_the_memory_bench_reports_each_mode():
    out = run_bench("bench/bench_memory.py", "--steps", "1000")
    assert [line.split()[0] for line in out.splitlines() if "peak RSS" in line] == ["plain", "trace", "watch"]


def test_the_interleaved_bench_prints_a_ratio_per_checker():
    out = run_bench("bench/bench_interleaved.py", "--rounds", "1", "--block-s", "0.02", "--models", "cnn")
    row = next(line for line in out.splitlines() if line.startswith("cnn"))
    assert row.count("x") == 3
