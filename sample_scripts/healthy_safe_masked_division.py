# Healthy: relative-error loss that skips zero targets the safe way ("double where"): the
# denominator is replaced before dividing, so no inf is ever created and gradients stay finite.
import torch
import torch.nn as nn

torch.manual_seed(0)
x = torch.randn(200, 6)
target = (x @ torch.randn(6)).relu()
target[::7] = 0.0
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)

for step in range(30):
    opt.zero_grad()
    pred = model(x).squeeze(1)
    valid = target != 0
    safe_target = torch.where(valid, target, torch.ones_like(target))
    rel = torch.where(valid, (pred - target) / safe_target, torch.zeros_like(pred))
    loss = rel.abs().sum() / valid.sum()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
