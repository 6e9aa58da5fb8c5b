# A small DDP regression run on CPU (gloo), launched with torchrun or
# `nandoctor run --nproc-per-node 2`. Two ways to break it, for the tests:
#   BAD_INDEX=55  sample 55 of the dataset holds a NaN: with DistributedSampler(shuffle=False)
#                 and batch 8 it is rank 1's batch at step 3 (one rank's bad data);
#   LOG_ZERO=1    at step 2 every rank adds log(out * 0) to its loss (a bug every rank hits).
#   DIE_AT=2      rank 1's process dies at step 2, a second in, while rank 0 waits for it in
#                 the step's all-reduce (no NaN anywhere: a dead peer; rank 0's collective fails);
#                 with DIE_WHILE=busy rank 1 dies at once while rank 0 is still busy with its
#                 own work (no collective fails: the launcher's SIGTERM stops rank 0);
#                 with DIE_HOW=kill it is SIGKILLed (as the OOM killer does) instead of exiting 9.
#   RAISE_AT=2    rank 1's script raises IndexError at step 2 (a bad label: no NaN anywhere)
#                 while rank 0 waits for it in the step's all-reduce.
#   CHECK_LOSS=1  the script checks its loss itself and raises before backward(), so the
#                 other rank waits in backward's all-reduce for a rank that never comes.
#   SHARED_SCALE=1 at step 2 each rank computes a scale from its batch, 0/0 on rank 1 only,
#                 and the ranks all_gather their scales into the loss: rank 0 computes with
#                 the NaN it received from rank 1 (one rank's bug, carried by a collective).
#   SQRT_ZERO=1   at step 2 rank 1 adds sqrt(0) to its loss: finite, but its gradient is NaN,
#                 which DDP then averages into every rank's gradients (a NaN seen first there).
# EPOCHS=N trains N epochs (8 steps each; the benchmark uses more).
import os, signal, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
BAD = int(os.environ.get("BAD_INDEX", "-1"))
LOG_ZERO = os.environ.get("LOG_ZERO") == "1"

class Rows(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(128, 8, generator=g)
        self.y = torch.randn(128, 1, generator=g)
    def __len__(self): return 128
    def __getitem__(self, i):
        x = self.x[i].clone()
        if i == BAD:
            x[0] = float("nan")
        return x, self.y[i]

model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
sampler = DistributedSampler(Rows(), shuffle=False)
loader = DataLoader(Rows(), batch_size=8, sampler=sampler)
step = 0
for epoch in range(int(os.environ.get("EPOCHS", "1"))):
    for x, y in loader:
        busy = os.environ.get("DIE_WHILE") == "busy"
        if step == int(os.environ.get("DIE_AT", "-1")):
            if rank == 1:
                time.sleep(0 if busy else 1)
                if os.environ.get("DIE_HOW") == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                os._exit(9)
            elif busy:
                time.sleep(60)
        if rank == 1 and step == int(os.environ.get("RAISE_AT", "-1")):
            raise IndexError(f"Target 5 is out of bounds at step {step}")
        out = model(x)
        loss = ((out - y) ** 2).mean()
        if LOG_ZERO and step == 2:
            loss = loss + torch.log(out * 0).mean()
        if os.environ.get("SHARED_SCALE") == "1" and step == 2:
            mine = x.abs().sum() * (rank == 0)
            scale = mine / mine
            scales = [torch.zeros(()) for _ in range(dist.get_world_size())]
            dist.all_gather(scales, scale)
            loss = loss * torch.stack(scales).mean()
        if os.environ.get("SQRT_ZERO") == "1" and step == 2:
            loss = loss + torch.sqrt(out.pow(2).sum() * (rank != 1))
        if os.environ.get("CHECK_LOSS") == "1" and not torch.isfinite(loss):
            raise FloatingPointError(f"rank {rank}: loss is {loss.item()} at step {step}")
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
if rank == 0:
    print("final", sum(p.sum().item() for p in model.parameters()))
dist.destroy_process_group()
