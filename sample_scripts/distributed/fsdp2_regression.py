# FSDP2 (fully_shard) on CPU with gloo, launched with torchrun or
# `nandoctor run --nproc-per-node 2`. BAD=1: rank 1's input holds a NaN at step 3.
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(dist.get_rank())
for step in range(6):
    x, y = torch.randn(8, 8, generator=g), torch.randn(8, 1, generator=g)
    if os.environ.get("BAD") and step == 3 and dist.get_rank() == 1:
        x[0, 0] = float("nan")
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(dist.get_rank(), "final", loss.item())
dist.destroy_process_group()
