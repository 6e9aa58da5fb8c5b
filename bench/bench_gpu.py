"""nandoctor's overhead on a GPU: a GPT-style model (SDPA with a causal mask, AdamW, bf16
autocast) on CUDA. Each run is its own process and prints its steady-state step time
(CUDA-synchronised, after warm-up) on stdout, so the modes are compared run against run:

  python bench/bench_gpu.py                                  # plain
  python -m nandoctor run --mode trace bench/bench_gpu.py    # trace: per-op flags on the device
  python -m nandoctor run --mode watch bench/bench_gpu.py
  python bench/bench_gpu.py --anomaly                        # torch.autograd.detect_anomaly
"""
from __future__ import annotations

import argparse
import contextlib
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, CONTEXT = 8192, 512


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, dim: int, heads: int, layers: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, dim), nn.Embedding(CONTEXT, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, VOCAB, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--anomaly", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = GPT(args.dim, 12, args.layers).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data = torch.randint(0, VOCAB, (args.warmup + args.steps, args.batch, CONTEXT + 1), device="cuda")
    anomaly = torch.autograd.detect_anomaly(check_nan=True) if args.anomaly else contextlib.nullcontext()
    with anomaly:
        for i in range(args.warmup + args.steps):
            if i == args.warmup:
                torch.cuda.synchronize()
                start = time.perf_counter()
            x, y = data[i, :, :-1], data[i, :, 1:]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x).float().view(-1, VOCAB), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - start) / args.steps * 1000
    print(f"{ms:.2f} ms/step, {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, "
          f"{torch.cuda.get_device_name()}, loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
