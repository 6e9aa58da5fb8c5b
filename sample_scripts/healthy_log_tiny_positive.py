# Healthy: sparse code assignments (relu, then normalised, so many entries are exactly 0) with a
# KL-to-uniform penalty using log(p + 1e-30). log(1e-30) = -69 is finite, as are its gradients.
import torch
import torch.nn as nn

torch.manual_seed(0)
x = torch.rand(256, 20)
encoder = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 8))
decoder = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 20))
opt = torch.optim.Adam(list(encoder.parameters()) + list(decoder.parameters()), lr=1e-2)
log_prior = torch.log(torch.full((8,), 1 / 8))

for step in range(40):
    opt.zero_grad()
    codes = torch.relu(encoder(x))
    p = codes / codes.sum(dim=1, keepdim=True).clamp_min(1e-6)
    kl = (p * (torch.log(p + 1e-30) - log_prior)).sum(dim=1).mean()
    recon = nn.functional.mse_loss(torch.sigmoid(decoder(p)), x)
    loss = recon + 0.01 * kl
    loss.backward()
    opt.step()
    print(f"step {step} recon {recon.item():.4f} kl {kl.item():.4f} zero codes {(p == 0).float().mean().item():.2f}")
