# Healthy: wind-direction loss atan2(v, u) on sensor-corrected wind vectors; calm readings are
# exactly (0, 0). torch gives atan2(0, 0) a zero gradient, so training stays finite.
import torch
import torch.nn as nn

torch.manual_seed(0)
wind = torch.randn(120, 2) * 4
wind[::6] = 0.0  # calm: anemometer reads exactly zero
true_gain = torch.tensor([1.3, 0.8])
observed_dir = torch.atan2(wind[:, 1] * true_gain[1], wind[:, 0] * true_gain[0])
gain = nn.Parameter(torch.ones(2))
opt = torch.optim.SGD([gain], lr=0.2)

for step in range(30):
    opt.zero_grad()
    corrected = wind * gain
    direction = torch.atan2(corrected[:, 1], corrected[:, 0])
    diff = torch.remainder(direction - observed_dir + torch.pi, 2 * torch.pi) - torch.pi
    loss = (diff**2).mean()
    loss.backward()
    opt.step()
    print(f"step {step} gain {gain.tolist()} loss {loss.item():.5f}")
