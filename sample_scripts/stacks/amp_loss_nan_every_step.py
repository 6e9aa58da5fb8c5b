# Credit-limit regressor trained with float16 autocast and GradScaler. The applicants' annual
# income goes in raw dollars (40k-180k): autocast casts the input of the first Linear to
# float16, every income above 65504 becomes inf, and the loss is NaN at every step. The scaler
# skips every step and keeps halving its scale; the weights never change.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = "cpu"

n = 512
income = 40_000 + 140_000 * torch.rand(n)
age = torch.randint(21, 70, (n,)).float()
debt_ratio = torch.rand(n)
late_payments = torch.poisson(torch.full((n,), 0.7))
x = torch.stack([income, age, debt_ratio, late_payments], dim=1)
limit = 0.1 * income / 1000 * (1 - debt_ratio) - 0.8 * late_payments + 2  # thousands

model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler(device)

for epoch in range(4):
    for i in range(0, n, 32):
        xb, yb = x[i : i + 32].to(device), limit[i : i + 32].to(device)
        opt.zero_grad()
        with torch.autocast(device, dtype=torch.float16):
            pred = model(xb).squeeze(-1)
            loss = F.mse_loss(pred, yb)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    print(f"epoch {epoch} loss {loss.item():.4f} scale {scaler.get_scale():g}")
