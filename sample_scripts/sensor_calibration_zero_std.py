# Calibrate per-channel gains/offsets of a sensor array, standardising each calibrated channel
# over time with (c - c.mean(0)) / c.std(0). Channel 5 is a dead sensor that reads a constant 0.
import torch
import torch.nn as nn

torch.manual_seed(0)
readings = torch.randn(200, 8) * 3 + 1
readings[:, 5] = 0.0  # dead sensor
labels = (readings[:, 0] + readings[:, 3] > 2).float()


class Calibrated(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(channels))
        self.offset = nn.Parameter(torch.zeros(channels))
        self.head = nn.Linear(channels, 1)

    def forward(self, x):
        c = x * self.gain + self.offset
        z = (c - c.mean(0)) / c.std(0)
        return self.head(z).squeeze(1)


model = Calibrated(8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(20):
    opt.zero_grad()
    loss = nn.functional.binary_cross_entropy_with_logits(model(readings), labels)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
