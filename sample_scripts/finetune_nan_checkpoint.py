# Fine-tune a classifier from a checkpoint written by an earlier run that had already diverged:
# one weight in the saved state_dict is NaN, so training is poisoned before the first step.
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn

torch.manual_seed(0)


def build_model():
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 4))


def write_old_checkpoint(path):
    """Stands in for the earlier pre-training job, which exported its weights via numpy."""
    rng = np.random.default_rng(0)
    state = {k: rng.normal(0, 0.1, v.shape).astype(np.float32) for k, v in build_model().state_dict().items()}
    state["2.weight"][1, 17] = np.nan
    torch.save({k: torch.from_numpy(v) for k, v in state.items()}, path)


ckpt_dir = tempfile.mkdtemp()
ckpt_path = os.path.join(ckpt_dir, "pretrained.pt")
write_old_checkpoint(ckpt_path)

model = build_model()
model.load_state_dict(torch.load(ckpt_path))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(128, 20)
y = torch.randint(0, 4, (128,))
for step in range(10):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
