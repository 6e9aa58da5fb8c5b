# Learn a colour-correction network whose linear output is gamma-encoded with out ** (1/2.2).
# The un-clamped linear layer produces some negative intensities; a negative base to a
# fractional power is NaN.
import torch
import torch.nn as nn

torch.manual_seed(0)
raw = torch.rand(256, 3)
target = raw.clamp(0, 1) ** (1 / 2.2)
model = nn.Linear(3, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

for step in range(30):
    opt.zero_grad()
    linear_rgb = model(raw)
    srgb = linear_rgb ** (1 / 2.2)
    loss = nn.functional.l1_loss(srgb, target)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
