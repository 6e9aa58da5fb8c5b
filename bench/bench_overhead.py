"""Overhead of nandoctor against plain python and torch.autograd.detect_anomaly.

    python bench/bench_overhead.py [--rounds 7] [--steps 100] [--models mlp cnn ...]

Runs each model of bench/models.py under: plain python, detect_anomaly, `nandoctor run
--mode trace` and `nandoctor run --mode watch`, and prints, per model, the in-loop time of
each relative to plain python, and the peak memory of each. Loop time excludes process
start and `import torch`.

How noise is kept out of a few-percent comparison on a shared VM:
- every run of a checker is paired with a plain run taken right next to it (which of the
  two goes first alternates from round to round), and ratios are taken within a pair:
  this machine's speed drifts over tens of seconds, and adjacent short runs share it;
- each run reports its median step time as well as its loop time: contention from other
  tenants comes in bursts that slow some steps by 2x, and the median step ignores them
  while a per-step overhead (what a checker adds to every step) shows in full;
- the table gives, per checker, the median over rounds of the paired median-step ratios,
  and in parentheses the median of the paired loop-time ratios;
- the runs are pinned to one CPU, and models.py freezes setup's objects out of the GC.
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

# About 1.5 s of loop each on a 2-core VM: long enough to time, short enough that the two
# runs of a pair see the same machine.
DEFAULT_STEPS = {"mlp": 250, "cnn": 50, "transformer": 30, "loader": 500, "gpt": 50, "compiled": 250}
RUNNERS = {
    "plain": lambda script, args: [sys.executable, script, *args],
    "detect_anomaly": lambda script, args: [sys.executable, script, *args, "--anomaly"],
    "trace": lambda script, args: [sys.executable, "-m", "nandoctor", "run", "--mode", "trace", script, *args],
    "watch": lambda script, args: [sys.executable, "-m", "nandoctor", "run", "--mode", "watch", script, *args],
}


def measure(runner: str, model: str, steps: int, threads: int, cpu: int | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        command = RUNNERS[runner](str(HERE / "models.py"), ["--model", model, "--steps", str(steps), "--out", str(out)])
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), **FIXED_MALLOC)
        pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
        proc = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              preexec_fn=pin)
        if proc.returncode != 0:
            raise SystemExit(f"{runner} on {model} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
        return json.loads(out.read_text())


def pick_cpu(threads: int, requested: int | None) -> int | None:
    """The CPU single-threaded runs are pinned to (None: leave unpinned)."""
    if threads != 1 or not hasattr(os, "sched_getaffinity"):
        return None
    return requested if requested is not None else min(os.sched_getaffinity(0))


def bench_model(model: str, rounds: int, steps: int, threads: int, cpu: int | None) -> tuple[dict, dict, dict, dict]:
    """Paired median-step ratios, paired loop ratios, loop times and peak memory, per runner."""
    checkers = [r for r in RUNNERS if r != "plain"]
    step_ratios = {r: [] for r in checkers}
    loop_ratios = {r: [] for r in checkers}
    times = {r: [] for r in RUNNERS}
    memory = {r: [] for r in RUNNERS}
    for round_number in range(rounds):
        shift = round_number % len(checkers)
        for checker in checkers[shift:] + checkers[:shift]:
            pair = ["plain", checker] if round_number % 2 == 0 else [checker, "plain"]
            results = {runner: measure(runner, model, steps, threads, cpu) for runner in pair}
            checked, plain = results[checker], results["plain"]
            step_ratios[checker].append(checked["step_median_s"] / plain["step_median_s"])
            loop_ratios[checker].append(checked["loop_s"] / plain["loop_s"])
            for runner, result in results.items():
                times[runner].append(result["loop_s"])
                memory[runner].append(result["peak_rss_mb"])
    return step_ratios, loop_ratios, times, memory


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "cnn", "transformer", "loader", "gpt", "compiled"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=None,
                    help="steps per run (default: per model, about 1.5 s of loop on a 2-core CPU)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: least noise)")
    ap.add_argument("--cpu", type=int, default=None,
                    help="CPU to pin single-threaded runs to (default: the first one this process may use)")
    ap.add_argument("--verbose", action="store_true", help="print every pair's ratio")
    args = ap.parse_args()
    cpu = pick_cpu(args.threads, args.cpu)

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}, torch threads {args.threads}"
          f"{f', pinned to CPU {cpu}' if cpu is not None else ''}; {args.rounds} rounds, each checker run "
          "next to a plain run")
    print("ratio to plain python: median of paired median-step ratios (median of paired loop-time ratios)")
    header = f"{'model':<12}{'plain':>9}" + "".join(f"{r:>22}" for r in RUNNERS if r != "plain") + f"{'peak MB p/a/t/w':>20}"
    print(header)
    for model in args.models:
        step_ratios, loop_ratios, times, memory = bench_model(
            model, args.rounds, args.steps or DEFAULT_STEPS[model], args.threads, cpu)
        cells = [f"{statistics.median(step_ratios[c]):5.2f}x ({statistics.median(loop_ratios[c]):4.2f}x)"
                 for c in step_ratios]
        mem = "/".join(f"{max(memory[r]):.0f}" for r in RUNNERS)
        if args.verbose:
            for checker, values in step_ratios.items():
                print(f"  {model} {checker} median-step ratio per pair: " + " ".join(f"{v:.3f}" for v in values))
        print(f"{model:<12}{statistics.median(times['plain']):8.2f}s" + "".join(f"{c:>22}" for c in cells)
              + f"{mem:>20}", flush=True)


if __name__ == "__main__":
    main()
