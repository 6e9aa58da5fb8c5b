# Mixture-of-experts regressor whose gate uses a hand-written softmax exp(z)/sum(exp(z)) without
# subtracting the max. The inputs are not normalised, gate logits pass 88.7 and exp overflows.
import torch
import torch.nn as nn

torch.manual_seed(0)


class MixtureOfExperts(nn.Module):
    def __init__(self, d_in, n_experts=4):
        super().__init__()
        self.gate = nn.Linear(d_in, n_experts)
        self.experts = nn.ModuleList(nn.Linear(d_in, 1) for _ in range(n_experts))

    def forward(self, x):
        z = self.gate(x)
        weights = torch.exp(z) / torch.exp(z).sum(dim=-1, keepdim=True)
        outs = torch.cat([e(x) for e in self.experts], dim=-1)
        return (weights * outs).sum(dim=-1)


x = torch.randn(128, 6) * torch.tensor([1.0, 10.0, 100.0, 300.0, 5.0, 50.0])
y = x[:, 0] * 2 + torch.where(x[:, 3] > 0, x[:, 1], -x[:, 2]) * 0.1
model = MixtureOfExperts(6)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(40):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
