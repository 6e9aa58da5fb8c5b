"""The host's side of a GPU trace run, measured on the CPU (when no GPU is at hand).

    python bench/bench_gpu_host.py [--layers 12] [--rounds 7]

On a GPU, trace mode's per-op work is host work: while it is more than the GPU's time for
the ops, the GPU waits. This trains bench_gpu.py's GPT (SDPA with a causal mask, AdamW,
bf16 autocast) at a tiny width on the CPU, where each op costs about its dispatch, as on
a GPU at a size the host cannot keep ahead of. It interleaves, in one process, blocks of
plain steps with blocks of: trace as it runs on an accelerator (device flags forced on),
the same with every op through the per-op mode (what a GPU run did before regions and
node checks took flags), trace as it runs on the CPU, and detect_anomaly. Printed: each
one's median ratio to the plain blocks around it. Syncs are not modelled (a CPU has none).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_gpu  # noqa: E402
from nandoctor.config import load_config  # noqa: E402
from nandoctor.detect.detector import Detector  # noqa: E402

VOCAB, WIDTH, HEADS, TOKENS, BATCH = 256, 32, 4, 16, 2


def _detector(**settings):
    return lambda: Detector(dict(load_config().run, **settings))


CHECKERS = {
    "trace_gpu_path": _detector(device_flags="always"),
    "per_op_flags": _detector(device_flags="always", module_regions=False, backward_by_node=False),
    "trace_cpu": _detector(),
    "detect_anomaly": lambda: torch.autograd.detect_anomaly(),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=20, help="steps per block")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message="Anomaly Detection has been enabled")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    bench_gpu.VOCAB = VOCAB  # (read by GPT.__init__)
    model = bench_gpu.GPT(WIDTH, HEADS, args.layers)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data = torch.randint(0, VOCAB, (8, BATCH, TOKENS + 1))

    def step(i: int) -> None:
        x, y = data[i % 8, :, :-1], data[i % 8, :, 1:]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).float().view(-1, VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def block(checker: str | None, steps: int) -> float:
        with CHECKERS[checker]() if checker else nullcontext():
            start = time.perf_counter()
            for i in range(steps):
                step(i)
            return (time.perf_counter() - start) / steps

    for checker in [None, *CHECKERS]:  # warm every path
        block(checker, 3)
    ratios: dict[str, list[float]] = {c: [] for c in CHECKERS}
    plain_ms = []
    for _ in range(args.rounds):
        before = block(None, args.steps)
        for checker in CHECKERS:
            checked = block(checker, args.steps)
            after = block(None, args.steps)
            ratios[checker].append(checked / ((before + after) / 2))
            plain_ms.append(before * 1e3)
            before = after
    print(f"GPT, {args.layers} layers of {WIDTH}, on the CPU: plain {statistics.median(plain_ms):.1f} ms/step, "
          f"{args.rounds} rounds, median ratio to the plain blocks around each")
    for checker, values in ratios.items():
        print(f"  {checker:<16}{statistics.median(values):.2f}x")


if __name__ == "__main__":
    main()
