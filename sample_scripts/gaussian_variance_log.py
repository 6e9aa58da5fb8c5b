# Estimate a sensor's noise variance by maximum likelihood on zero-mean residuals. The variance
# is a raw parameter (no softplus/exp) and an overshooting SGD step makes it negative: log is NaN.
import torch

torch.manual_seed(0)
residuals = 0.5 * torch.randn(500)
var = torch.nn.Parameter(torch.tensor(5.0))
opt = torch.optim.SGD([var], lr=100.0)

for step in range(20):
    opt.zero_grad()
    nll = 0.5 * torch.log(var) + (residuals**2).mean() / (2 * var)
    nll.backward()
    opt.step()
    print(f"step {step} var {var.item():.3f} nll {nll.item():.4f}")
