"""Watch-mode overhead on a 2-rank DDP run (gloo, CPU), as a user launches it.

    python bench/bench_ddp.py [--rounds 5] [--epochs 40]

Times whole launches, alternating `torchrun --nproc-per-node 2 ddp_regression.py` and
`nandoctor run --nproc-per-node 2 --mode watch ddp_regression.py` (and trace), and prints
the median of each and its ratio to plain torchrun. Whole launches include process start,
the torch import and the rendezvous in both, so the ratio understates the per-step cost on
long runs and overstates it on short ones: --epochs sets the run's length (8 steps each).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "sample_scripts" / "distributed" / "ddp_regression.py"
RUNNERS = {
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"],
    "watch": [sys.executable, "-m", "nandoctor", "run", "--nproc-per-node", "2", "--mode", "watch"],
    "trace": [sys.executable, "-m", "nandoctor", "run", "--nproc-per-node", "2", "--mode", "trace"],
}


def timed(command: list[str], epochs: int) -> float:
    env = dict(os.environ, EPOCHS=str(epochs), OMP_NUM_THREADS="1")
    start = time.perf_counter()
    subprocess.run([*command, str(SCRIPT)], env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=40)
    args = ap.parse_args()
    times: dict[str, list[float]] = {name: [] for name in RUNNERS}
    for _ in range(args.rounds):
        for name, command in RUNNERS.items():
            times[name].append(timed(command, args.epochs))
    base = statistics.median(times["torchrun"])
    print(f"2-rank DDP (gloo, CPU), {args.epochs * 8} steps, median of {args.rounds} whole launches")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:9s} {median:7.2f} s  {median / base:5.2f}x")


if __name__ == "__main__":
    main()
