# Rain prediction from windows of barometric pressure (~1013 hPa). The model standardises each
# window with a one-pass std sqrt(E[x^2] - E[x]^2); float32 cancellation makes it negative.
import torch
import torch.nn as nn

torch.manual_seed(0)


class WindowStandardize(nn.Module):
    def forward(self, x):
        mean = x.mean(dim=1, keepdim=True)
        var = (x * x).mean(dim=1, keepdim=True) - mean * mean
        std = torch.sqrt(var)
        return (x - mean) / (std + 1e-5)


pressure = 1013.0 + torch.cumsum(0.002 * torch.randn(128, 48), dim=1)
rain = (pressure[:, -1] < pressure[:, 0]).float()
model = nn.Sequential(WindowStandardize(), nn.Linear(48, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(10):
    opt.zero_grad()
    loss = nn.functional.binary_cross_entropy_with_logits(model(pressure).squeeze(1), rain)
    loss.backward()
    opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
