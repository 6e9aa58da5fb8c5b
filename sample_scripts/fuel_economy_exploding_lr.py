# Fuel-consumption regression on raw engine displacement (cc) and curb weight (kg), no feature
# scaling, with a learning rate that would suit standardised inputs: the loss explodes to inf.
import torch
import torch.nn as nn

torch.manual_seed(0)
displacement = torch.rand(300, 1) * 4000 + 1000
weight = torch.rand(300, 1) * 1200 + 900
x = torch.cat([displacement, weight], dim=1)
litres_per_100km = 0.002 * displacement + 0.004 * weight + torch.randn(300, 1) * 0.5

model = nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(200):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), litres_per_100km)
    loss.backward()
    opt.step()
    print(f"epoch {epoch} loss {loss.item():.3e}")
