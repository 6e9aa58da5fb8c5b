# Direction-prediction net whose targets are unit vectors made with v / v.norm(). Some samples
# have zero velocity, so v.norm() is 0 and the hand-written normalisation gives 0/0 = NaN.
import torch
import torch.nn as nn

torch.manual_seed(0)
positions = torch.randn(100, 6, 2).cumsum(dim=1)
positions[::10, 5] = positions[::10, 4]  # parked vehicles: last two positions identical
history = positions[:, :5].reshape(100, 10)
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)

for step in range(20):
    opt.zero_grad()
    v = positions[:, 5] - positions[:, 4]
    direction = v / v.norm(dim=-1, keepdim=True)
    pred = model(history)
    pred = pred / pred.norm(dim=-1, keepdim=True)
    loss = (1 - (pred * direction).sum(dim=-1)).mean()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
