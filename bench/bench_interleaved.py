"""Overhead measured in one process, with the four runners interleaved block by block.

    python bench/bench_interleaved.py [--rounds 15] [--block-s 0.25] [--models mlp cnn ...]

bench_overhead.py measures what a user sees (`nandoctor run` in its own process) but, on a
shared VM whose speed changes by 2x over seconds, separate processes are too far apart in
time for a few-percent comparison. Here one process per model trains in short blocks of
steps, alternating: plain, detect_anomaly, nandoctor's per-op detector (what `--mode trace`
runs) and its step watcher (`--mode watch`), each block next to a plain block. A checker's
ratio in a round is its block time over the mean of the plain blocks just before and after
it, and the table gives the median over rounds. What this leaves out is only what is the
same for every step of a run: process start and nandoctor's import.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import warnings
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import models  # noqa: E402  (bench/models.py: the same four training loops)
from nandoctor.config import load_config  # noqa: E402
from nandoctor.detect.detector import Detector  # noqa: E402
from nandoctor.detect.watch import StepWatcher  # noqa: E402

CHECKERS = {
    "detect_anomaly": lambda: torch.autograd.detect_anomaly(),
    "trace": lambda: Detector(load_config().run),
    "watch": lambda: StepWatcher(load_config().run),
}

# Trace as it runs on an accelerator: each check queued as a device flag and read at the
# step's boundaries rather than read on the host at once. On the CPU this is the host-side
# work of a GPU run (the kernel launches aside): what keeps a GPU waiting on the host.
TRACE_WITH_FLAGS = {"trace_flags": lambda: Detector(dict(load_config().run, device_flags="always"))}

# Watch as `run.watch_gradients: true` runs it: the gradients' norm read at every step too.
WATCH_GRADIENTS = {"watch_grads": lambda: StepWatcher(dict(load_config().run, watch_gradients=True))}


def block(step, steps: int, checker: str | None, checkers=CHECKERS) -> float:
    context = checkers[checker]() if checker else nullcontext()
    with context:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        return time.perf_counter() - start


def bench_model(name: str, rounds: int, block_s: float, checkers=CHECKERS) -> dict[str, list[float]]:
    torch.manual_seed(0)
    with Detector(load_config().run):  # as in a script: torch.compile is called under nandoctor
        model, opt, loss_fn = models.MODELS[name]()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn().backward()
        opt.step()

    for checker in [None, *checkers]:  # warm every path: allocator, kernels, caches
        block(step, 5, checker, checkers)
    start = time.perf_counter()
    block(step, 5, None)
    steps = max(2, round(block_s / ((time.perf_counter() - start) / 5)))
    gc.collect()
    gc.freeze()
    ratios: dict[str, list[float]] = {c: [] for c in checkers}
    names = list(checkers)
    for round_number in range(rounds):
        shift = round_number % len(names)
        before = block(step, steps, None)
        for checker in names[shift:] + names[:shift]:
            checked = block(step, steps, checker, checkers)
            after = block(step, steps, None)
            ratios[checker].append(checked / ((before + after) / 2))
            before = after
    return ratios


def main() -> None:
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:
        # The same fixed glibc thresholds as bench_overhead.py; they only act from process start.
        from bench_overhead import FIXED_MALLOC

        os.execve(sys.executable, [sys.executable, *sys.argv], dict(os.environ, **FIXED_MALLOC))
    warnings.filterwarnings("ignore", message="Anomaly Detection has been enabled")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(models.MODELS))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--block-s", type=float, default=0.25, help="seconds of plain training per block")
    ap.add_argument("--verbose", action="store_true", help="print every round's ratio")
    ap.add_argument("--device-flags", action="store_true",
                    help="also trace with device flags, as on a GPU (the host's side of it)")
    ap.add_argument("--watch-gradients", action="store_true",
                    help="also watch with run.watch_gradients (every gradient read at each step)")
    args = ap.parse_args()
    checkers = dict(CHECKERS)
    if args.device_flags:
        checkers.update(TRACE_WITH_FLAGS)
    if args.watch_gradients:
        checkers.update(WATCH_GRADIENTS)
    print_table(checkers, args.models, args.rounds, args.block_s, args.verbose)


def print_table(checkers, model_names, rounds: int, block_s: float, verbose: bool = False) -> None:
    """One thread on one CPU (the least noise), then a row of median ratios per model."""
    torch.set_num_threads(1)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    print(f"in-process, interleaved blocks of ~{block_s}s, {rounds} rounds, torch threads 1, one CPU")
    print(f"{'model':<12}" + "".join(f"{c:>16}" for c in checkers) + "   (median ratio to the plain blocks around it)")
    for name in model_names:
        ratios = bench_model(name, rounds, block_s, checkers)
        if verbose:
            for checker, values in ratios.items():
                print(f"  {name} {checker}: " + " ".join(f"{v:.3f}" for v in values))
        print(f"{name:<12}" + "".join(f"{statistics.median(v):15.2f}x" for v in ratios.values()), flush=True)

if __name__ == "__main__":
    main()
