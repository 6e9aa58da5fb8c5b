"""Overhead of nandoctor against plain python and torch.autograd.detect_anomaly.

    python bench/bench_overhead.py [--rounds 3] [--steps 100] [--models mlp cnn ...]

Runs each model of bench/models.py under: plain python, detect_anomaly, `nandoctor run
--mode trace` and `nandoctor run --mode watch`, alternating the four in every round, in
an order that rotates from round to round (so machine noise hits them alike), and prints the median of the per-round in-loop time ratios to plain python
and the peak memory of each. Loop time excludes process start and `import torch`.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# glibc adapts its mmap threshold to each process's allocation history, so the same loop
# can take 10-20% more time in one process than in another from page faults alone (seen
# here: 85,000 faults in one plain run's loop, 126 in a nandoctor run's). Fixed thresholds,
# the same for every runner, take that confounder out of the comparison.
FIXED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(256 << 20), "MALLOC_TRIM_THRESHOLD_": str(512 << 20)}

# Long enough loops that the few-percent differences watch mode is judged on are not noise.
DEFAULT_STEPS = {"mlp": 400, "cnn": 100, "transformer": 60, "loader": 800}
RUNNERS = {
    "plain": lambda script, args: [sys.executable, script, *args],
    "detect_anomaly": lambda script, args: [sys.executable, script, *args, "--anomaly"],
    "trace": lambda script, args: [sys.executable, "-m", "nandoctor", "run", "--mode", "trace", script, *args],
    "watch": lambda script, args: [sys.executable, "-m", "nandoctor", "run", "--mode", "watch", script, *args],
}


def measure(runner: str, model: str, steps: int, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        command = RUNNERS[runner](str(HERE / "models.py"), ["--model", model, "--steps", str(steps), "--out", str(out)])
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), **FIXED_MALLOC)
        subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "cnn", "transformer", "loader"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None,
                    help="steps per run (default: per model, about 3-4 s of loop on a 2-core CPU)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: least noise)")
    args = ap.parse_args()

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}, torch threads {args.threads}, "
          f"{args.rounds} rounds (median)")
    header = f"{'model':<12}" + "".join(f"{r:>16}" for r in RUNNERS) + f"{'peak MB p/a/t/w':>24}"
    print(header)
    for model in args.models:
        times = {r: [] for r in RUNNERS}
        memory = {r: [] for r in RUNNERS}
        names = list(RUNNERS)
        for round_number in range(args.rounds):
            # Rotate the order every round so drift (frequency, caches) hits every runner alike.
            shift = round_number % len(names)
            for runner in names[shift:] + names[:shift]:
                result = measure(runner, model, args.steps or DEFAULT_STEPS[model], args.threads)
                times[runner].append(result["loop_s"])
                memory[runner].append(result["peak_rss_mb"])
        cells = []
        for runner in RUNNERS:
            # The median of per-round ratios: each round's runs were taken side by side.
            ratio = statistics.median(t / p for t, p in zip(times[runner], times["plain"]))
            cells.append(f"{statistics.median(times[runner]):7.2f}s {ratio:5.2f}x")
        mem = "/".join(f"{max(memory[r]):.0f}" for r in RUNNERS)
        print(f"{model:<12}" + "".join(f"{c:>16}" for c in cells) + f"{mem:>24}", flush=True)


if __name__ == "__main__":
    main()
