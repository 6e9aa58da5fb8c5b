# Healthy: full-batch logistic regression (with a small hidden layer) fitted by L-BFGS with a
# strong-Wolfe line search; optimizer.step(closure) re-evaluates the loss several times per step.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)

x = torch.randn(400, 6)
w_true = torch.tensor([1.5, -2.0, 0.5, 0.0, 1.0, -0.5])
y = (x @ w_true + 0.3 * torch.randn(400) > 0).float()

model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.LBFGS(model.parameters(), lr=1, max_iter=20, history_size=10,
                        line_search_fn="strong_wolfe")


def closure():
    opt.zero_grad()
    loss = F.binary_cross_entropy_with_logits(model(x).squeeze(-1), y) + 1e-3 * sum(
        (p**2).sum() for p in model.parameters())
    loss.backward()
    return loss


for epoch in range(5):
    loss = opt.step(closure)
    with torch.no_grad():
        acc = ((model(x).squeeze(-1) > 0).float() == y).float().mean()
    print(f"epoch {epoch} loss {loss.item():.4f} acc {acc.item():.3f}")
