"""Memory over a long healthy run: peak RSS every 1,000 steps under trace and watch.

    python bench/bench_memory.py [--steps 10000]

A small Transformer layer with a -inf causal mask (so the detector records an Inf suspect
every step) trains for --steps steps; the detector's own state must not grow.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

TRAIN = """\
import resource, sys, torch
import torch.nn.functional as F
torch.manual_seed(0)
torch.set_num_threads(1)
layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
mask = torch.full((8, 8), float("-inf")).triu(1)
opt = torch.optim.Adam(layer.parameters(), lr=1e-3)
for step in range(1, int(sys.argv[1]) + 1):
    opt.zero_grad()
    F.mse_loss(layer(torch.randn(4, 8, 16), src_mask=mask), torch.zeros(4, 8, 16)).backward()
    opt.step()
    if step % 1000 == 0:
        print(step, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(TRAIN)
        for label, prefix in (("plain", [sys.executable]),
                              ("trace", [sys.executable, "-m", "nandoctor", "run", "--mode", "trace"]),
                              ("watch", [sys.executable, "-m", "nandoctor", "run", "--mode", "watch"])):
            out = subprocess.run([*prefix, str(script), str(args.steps)], capture_output=True, text=True, check=True)
            peaks = [line.split()[1] for line in out.stdout.splitlines() if line[:1].isdigit()]
            print(f"{label:<6} peak RSS MB every 1000 steps: {' '.join(peaks)}", flush=True)


if __name__ == "__main__":
    main()
