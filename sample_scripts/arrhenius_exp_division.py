# Arrhenius kinetics: rate = A / exp(Ea / (R*T)). The activation energy was entered in J/mol but
# R in kJ/(mol K), so the exponent is ~20000: exp overflows to inf, rate is 0, gradients are NaN.
import torch

torch.manual_seed(0)
R = 8.314e-3  # kJ / (mol K)  -- but the energy below is in J/mol
temps = torch.linspace(300.0, 400.0, 32)
measured = 1e6 * torch.exp(-55.0 / (R * temps)) * (1 + 0.05 * torch.randn(32))
log_prefactor = torch.nn.Parameter(torch.tensor(13.0))
energy = torch.nn.Parameter(torch.tensor(50000.0))
opt = torch.optim.Adam([log_prefactor, energy], lr=0.05)

for step in range(20):
    opt.zero_grad()
    rate = torch.exp(log_prefactor) / torch.exp(energy / (R * temps))
    loss = ((rate - measured) ** 2).mean()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4e}")
