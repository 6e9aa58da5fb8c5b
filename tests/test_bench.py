"""The benchmarks run with one command each (here with tiny loops: timings are measured by
running the benchmarks themselves, never asserted in a test)."""
from __future__ import annotations

import math
import re
import subprocess
import sys

from helpers import REPO

CHECKERS = ["detect_anomaly", "trace", "watch"]
RATIO = r"(\d+\.\d+)x"


def run_bench(*args: str) -> str:
    # A real process: a benchmark times and measures processes it starts itself, so most of
    # each test's time is their start (python, torch, nandoctor), whatever the steps.
    proc = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def table(out: str, model: str) -> tuple[str, str]:
    """The header line (it starts with `model`) and the row of `model`."""
    lines = out.splitlines()
    header = next(line for line in lines if line.split()[:1] == ["model"])
    row = next(line for line in lines if line.split()[:1] == [model])
    return header, row


def ratios_under_columns(header: str, row: str, cell: str, checkers=CHECKERS) -> dict[str, tuple[float, ...]]:
    """Per checker, the numbers of the cell right-aligned under its name in the header.

    `cell` is the cell's pattern; the cell must end exactly where the column name ends.
    """
    found = {}
    for checker in checkers:
        column = re.search(rf"(?<!\S){checker}(?!\S)", header)
        assert column, f"no column {checker!r} in {header!r}"
        end = column.end()
        match = re.search(rf"(?<!\S){cell}$", row[:end]) if len(row) >= end else None
        assert match and row[end: end + 1] in ("", " "), (
            f"no ratio under {checker!r}:\n{header}\n{row}"
        )
        found[checker] = tuple(float(group) for group in match.groups())
    return found


def assert_positive_finite(ratios: dict[str, tuple[float, ...]]) -> None:
    for checker, values in ratios.items():
        assert all(math.isfinite(v) and v > 0 for v in values), (checker, values)


def test_the_overhead_bench_prints_a_row_per_model_with_a_ratio_per_checker():
    out = run_bench("bench/bench_overhead.py", "--rounds", "1", "--steps", "2", "--models", "mlp")
    header, row = table(out, "mlp")
    # Each cell: the paired median-step ratio, then the paired loop-time ratio in parentheses.
    ratios = ratios_under_columns(header, row, rf"{RATIO} \({RATIO}\)")
    assert list(ratios) == CHECKERS
    assert_positive_finite(ratios)
    assert len(re.findall(RATIO, row)) == 2 * len(CHECKERS)  # no other ratio on the row


def test_the_memory_bench_reports_each_mode():
    out = run_bench("bench/bench_memory.py", "--steps", "1000")
    assert [line.split()[0] for line in out.splitlines() if "peak RSS" in line] == ["plain", "trace", "watch"]


def test_the_interleaved_bench_prints_a_ratio_per_checker():
    out = run_bench("bench/bench_interleaved.py", "--rounds", "1", "--block-s", "0.02", "--models", "cnn")
    header, row = table(out, "cnn")
    ratios = ratios_under_columns(header, row, RATIO)
    assert list(ratios) == CHECKERS
    assert_positive_finite(ratios)
    assert len(re.findall(RATIO, row)) == len(CHECKERS)


def test_the_interleaved_bench_adds_watch_reading_every_gradient_on_request():
    out = run_bench("bench/bench_interleaved.py", "--rounds", "1", "--block-s", "0.02", "--models", "mlp",
                    "--watch-gradients")
    header, row = table(out, "mlp")
    ratios = ratios_under_columns(header, row, RATIO, [*CHECKERS, "watch_grads"])
    assert list(ratios) == [*CHECKERS, "watch_grads"]
    assert_positive_finite(ratios)


def test_the_breakdown_bench_prints_a_ratio_per_layer_of_the_cost():
    out = run_bench("bench/bench_breakdown.py", "--rounds", "1", "--block-s", "0.02", "--models", "mlp")
    header, row = table(out, "mlp")
    assert header.split()[1:6] == ["empty_mode", "sum_every_op", "trace_bwd_by_op", "trace_fwd_by_op", "trace"]
    ratios = [float(r) for r in re.findall(RATIO, row)]
    assert len(ratios) == 5 and all(math.isfinite(r) and r > 0 for r in ratios)


def test_the_overhead_bench_knows_how_long_to_run_every_model():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import bench_overhead
        import models
    finally:
        sys.path.remove(str(REPO / "bench"))
    assert set(bench_overhead.DEFAULT_STEPS) == set(models.MODELS)
