# Healthy: a model whose scratch buffers come from torch.empty (uninitialised memory, may hold any
# bit pattern) but are always fully written before they are read.
import torch
import torch.nn as nn

torch.manual_seed(0)


class RunningFeatures(nn.Module):
    def __init__(self, d_in, d_hidden, window):
        super().__init__()
        self.proj = nn.Linear(d_in, d_hidden)
        self.head = nn.Linear(2 * d_hidden, 1)
        self.register_buffer("history", torch.empty(window, d_hidden))
        self.register_buffer("stats", torch.empty(2, d_hidden))

    def forward(self, x):
        h = torch.tanh(self.proj(x))
        with torch.no_grad():
            self.history.copy_(h[-self.history.shape[0] :].detach())
            self.stats[0].copy_(self.history.mean(dim=0))
            self.stats[1].fill_(1.0).add_(self.history.var(dim=0))
        return self.head(torch.cat([h - self.stats[0], h / self.stats[1].sqrt()], dim=1))


x = torch.randn(64, 12)
y = x[:, :2].prod(dim=1, keepdim=True)
model = RunningFeatures(12, 24, window=16)
scratch = torch.empty(64, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for step in range(30):
    opt.zero_grad()
    pred = model(x)
    torch.sub(pred.detach(), y, out=scratch)
    loss = (pred - y).pow(2).mean()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f} max_err {scratch.abs().max().item():.3f}")
