# Fit a cannon's muzzle speed from (range, elevation) measurements with theta = asin(g*R/v^2)/2.
# The speed starts far too low, so g*R/v^2 > 1 for the long shots and asin is NaN.
import torch

torch.manual_seed(0)
g = 9.81
true_speed = 25.0
theta = torch.rand(64) * 0.6 + 0.1
ranges = true_speed**2 * torch.sin(2 * theta) / g + 0.3 * torch.randn(64)
speed = torch.nn.Parameter(torch.tensor(12.0))
opt = torch.optim.Adam([speed], lr=0.5)

for step in range(50):
    opt.zero_grad()
    predicted = 0.5 * torch.asin(g * ranges / speed**2)
    loss = ((predicted - theta) ** 2).mean()
    loss.backward()
    opt.step()
    print(f"step {step} speed {speed.item():.2f} loss {loss.item():.5f}")
