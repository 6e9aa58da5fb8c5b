"""Benchmark training loops, run by bench_overhead.py under python, detect_anomaly and nandoctor.

Each model trains for --steps steps; the loop (not the process start or the torch import)
is timed with perf_counter, as is each step, and the loop time, the median step time and
the peak RSS are written as one JSON line to --out.
"""
import argparse
import gc
import json
import resource
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def mlp():
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))
    x, y = torch.randn(128, 784), torch.randint(0, 10, (128,))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3), lambda: F.cross_entropy(model(x), y)


def cnn():
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(64, 10),
    )
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), lambda: F.cross_entropy(model(x), y)


def transformer():
    V, D, L = 1000, 128, 64

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, D)
            layer = nn.TransformerEncoderLayer(D, 4, 256, dropout=0.1, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(D, V)
            self.register_buffer("mask", torch.full((L, L), float("-inf")).triu(1))

        def forward(self, tokens):
            return self.head(self.encoder(self.emb(tokens), mask=self.mask))

    model = LM()
    seq = torch.randint(0, V, (16, L + 1))
    loss = lambda: F.cross_entropy(model(seq[:, :-1]).reshape(-1, V), seq[:, 1:].reshape(-1))
    return model, torch.optim.AdamW(model.parameters(), lr=3e-4), loss


def loader():
    """An MNIST-sized classifier fed by a shuffling DataLoader (collation in the loop)."""
    data = TensorDataset(torch.randn(8192, 784), torch.randint(0, 10, (8192,)))
    batches = DataLoader(data, batch_size=128, shuffle=True)
    model = nn.Sequential(nn.Linear(784, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 10))
    stream = iter(())

    def loss():
        nonlocal stream
        try:
            x, y = next(stream)
        except StopIteration:
            stream = iter(batches)
            x, y = next(stream)
        return F.cross_entropy(model(x), y)

    return model, torch.optim.Adam(model.parameters(), lr=1e-3), loss


def gpt():
    """A GPT-style decoder: SDPA causal attention, pre-norm blocks, AdamW, bf16 autocast."""
    V, D, H, L, layers = 512, 128, 4, 64, 2

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
            self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
            self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, H, D // H).permute(2, 0, 3, 1, 4)
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(attn.transpose(1, 2).reshape(b, t, D))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(V, D), nn.Embedding(L, D)
            self.blocks = nn.Sequential(*(Block() for _ in range(layers)))
            self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, V, bias=False)

        def forward(self, tokens):
            x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
            return self.head(self.ln(self.blocks(x)))

    model = GPT()
    seq = torch.randint(0, V, (8, L + 1))

    def loss():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(seq[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, V), seq[:, 1:].reshape(-1))

    return model, torch.optim.AdamW(model.parameters(), lr=3e-4), loss


def compiled():
    """The MLP under torch.compile (inductor; compiled during the warm-up steps)."""
    model, opt, _ = mlp()
    fast = torch.compile(model)
    x, y = torch.randn(128, 784), torch.randint(0, 10, (128,))
    return model, opt, lambda: F.cross_entropy(fast(x), y)


MODELS = {"mlp": mlp, "cnn": cnn, "transformer": transformer, "loader": loader, "gpt": gpt, "compiled": compiled}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=MODELS, required=True)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--anomaly", action="store_true", help="wrap the loop in torch.autograd.detect_anomaly()")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    model, opt, loss_fn = MODELS[args.model]()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()
        return loss

    for _ in range(5):  # warm-up: allocator, kernels, lazy init
        step()
    # A full collection walks every object in the process (~300k after `import torch`, and
    # more under nandoctor), 70-100 ms each here; whether one lands inside the timed loop is
    # luck, worth ±4% of a 2.5 s loop. Freezing what setup made keeps collections to the
    # loop's own garbage, so runs compare the loops and not the heap sizes.
    gc.collect()
    gc.freeze()
    context = torch.autograd.detect_anomaly() if args.anomaly else torch.autograd.set_grad_enabled(True)
    faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step_times = []
    with context:
        start = time.perf_counter()
        for _ in range(args.steps):
            before = time.perf_counter()
            loss = step()
            step_times.append(time.perf_counter() - before)
        float(loss.detach())
        elapsed = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(args.out, "w") as f:
        json.dump({"loop_s": elapsed, "step_median_s": statistics.median(step_times), "peak_rss_mb": usage.ru_maxrss / 1024,
                   "page_faults_in_loop": usage.ru_minflt - faults_before}, f)


if __name__ == "__main__":
    main()
