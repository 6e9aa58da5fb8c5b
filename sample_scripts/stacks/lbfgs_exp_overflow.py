# Fit a bacterial growth curve N(t) = n0 * exp(r * t) to plate counts with L-BFGS
# (optimizer.step(closure)). Time is in minutes and there is no line search: L-BFGS's first
# step has length lr=1 and moves r from 0.001 to ~1, so exp(r * t) = exp(600) overflows to inf
# in the closure's second evaluation.
import torch

torch.manual_seed(0)

t = torch.linspace(0, 600, 40)  # minutes
counts = 50 * torch.exp(0.008 * t) * (1 + 0.05 * torch.randn(40))

log_n0 = torch.zeros((), requires_grad=True)
rate = torch.full((), 0.001, requires_grad=True)
opt = torch.optim.LBFGS([log_n0, rate], lr=1, max_iter=20, history_size=10)


def closure():
    opt.zero_grad()
    pred = torch.exp(log_n0) * torch.exp(rate * t)
    loss = ((pred - counts) ** 2).mean()
    loss.backward()
    return loss


for epoch in range(5):
    loss = opt.step(closure)
    print(f"epoch {epoch} loss {loss.item():.4f} n0 {log_n0.exp().item():.2f} r {rate.item():.5f}")
