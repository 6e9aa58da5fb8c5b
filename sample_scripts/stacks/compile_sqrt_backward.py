# A point-cloud classifier compiled with torch.compile (default inductor backend). Each
# point's feature is weighted by its distance to the others, and the distances are a plain
# sqrt of summed squared differences, self-distances included: sqrt(0) = 0 is fine in the
# forward, but its derivative 1/(2*sqrt(0)) is Inf, so the compiled backward makes NaN
# gradients at step 0. The NaN is made inside inductor's fused backward kernels.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class DistanceNet(nn.Module):
    def __init__(self, classes=3):
        super().__init__()
        self.embed = nn.Linear(3, 16)
        self.head = nn.Linear(16, classes)

    def forward(self, points):
        f = self.embed(points)
        diff = f.unsqueeze(2) - f.unsqueeze(1)
        dist = torch.sqrt((diff**2).sum(-1))
        weights = torch.softmax(-dist, dim=-1)
        return self.head((weights @ f).mean(1))


clouds = torch.randn(64, 12, 3)
labels = torch.randint(0, 3, (64,))
model = torch.compile(DistanceNet())
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for epoch in range(3):
    for i in range(0, 64, 16):
        loss = F.cross_entropy(model(clouds[i : i + 16]), labels[i : i + 16])
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
