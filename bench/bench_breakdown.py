"""Where trace mode's cost goes, measured the way bench_interleaved.py measures it.

    python bench/bench_breakdown.py [--rounds 9] [--models transformer gpt ...]

Three dispatch modes run interleaved with plain blocks, each a layer of what trace mode
does per op:

- `empty_mode`: a TorchDispatchMode that only calls the op. What any per-op Python
  checker pays before it checks anything (torch calling into Python for every op,
  optimizer ops included: trace mode leaves those out, so this can exceed trace).
- `sum_every_op`: the same, plus `out.sum().item()` on every float output: the cheapest
  exact finiteness check, on every op with no skipping.
- `trace_bwd_by_op`: nandoctor's detector with backward checked op by op and no module
  regions, as it was before backward was checked node by node (and as the seeded replay
  still checks everything).
- `trace_fwd_by_op`: the detector with backward node by node and every forward op
  through the mode, as it was before torch.nn's modules ran as regions (detect/regions.py).
- `trace`: nandoctor's detector (what `--mode trace` runs): ops that cannot make a NaN
  skipped, the sum check on the rest, the forward line of each autograd node, module
  names, a -inf mask's record carried, a plain backward checked node by node (see
  detect/nodes.py), torch.nn's own modules run as regions checked at their outputs (see
  detect/regions.py), the training boundaries.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_interleaved  # noqa: E402
import models  # noqa: E402


class EmptyMode(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as nandoctor's mode: no torch._disable_dynamo wrapper per op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class SumEveryOp(EmptyMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel():
            math.isfinite(out.sum().item())
        return out


def _trace(**settings):
    from nandoctor.config import load_config
    from nandoctor.detect.detector import Detector

    return lambda: Detector(dict(load_config().run, **settings))


LAYERS = {
    "empty_mode": EmptyMode,
    "sum_every_op": SumEveryOp,
    "trace_bwd_by_op": _trace(backward_by_node=False, module_regions=False),
    "trace_fwd_by_op": _trace(module_regions=False),
    "trace": bench_interleaved.CHECKERS["trace"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Not the compiled model: under a plain dispatch mode torch.compile runs nothing
    # compiled (and traces the mode's handler), so its layers would measure another program.
    ap.add_argument("--models", nargs="+", default=[m for m in models.MODELS if m != "compiled"])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--block-s", type=float, default=0.25, help="seconds of plain training per block")
    args = ap.parse_args()
    bench_interleaved.print_table(LAYERS, args.models, args.rounds, args.block_s)

if __name__ == "__main__":
    main()
