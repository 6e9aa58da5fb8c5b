# Healthy: float16 autocast + torch.amp.GradScaler on an MLP classifier. init_scale is 2**30,
# so the first scaled backward passes overflow float16: the scaler finds Inf gradients, skips
# those optimizer steps and halves the scale until it fits, then training goes on normally.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = "cpu"

x = torch.randn(1024, 20)
y = (x[:, :5].sum(dim=1) > 0).long()
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scaler = torch.amp.GradScaler(device, init_scale=2.0**30, growth_interval=50)

skipped = 0
for epoch in range(4):
    for i in range(0, len(x), 64):
        xb, yb = x[i : i + 64].to(device), y[i : i + 64].to(device)
        opt.zero_grad()
        with torch.autocast(device, dtype=torch.float16):
            loss = F.cross_entropy(model(xb), yb)
        scale = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        skipped += scaler.get_scale() < scale
    print(f"epoch {epoch} loss {loss.item():.4f} scale {scaler.get_scale():.0f} skipped steps {skipped}")
