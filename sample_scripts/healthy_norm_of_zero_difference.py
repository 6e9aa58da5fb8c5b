# Healthy: point-set registration with a Euclidean-distance loss via torch.linalg.vector_norm;
# ten points already sit exactly on their targets. torch defines the norm's gradient at 0 as 0.
import torch
import torch.nn as nn

torch.manual_seed(0)
anchors = torch.randn(50, 2)
targets = anchors.clone()
targets[10:] += 0.5 * torch.randn(40, 2)  # the first ten points need no correction
offset = nn.Parameter(torch.zeros(50, 2))
opt = torch.optim.SGD([offset], lr=0.5)

for step in range(30):
    opt.zero_grad()
    dist = torch.linalg.vector_norm(anchors + offset - targets, dim=1)
    loss = dist.mean()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.5f} exact zeros {(dist == 0).sum().item()}")
