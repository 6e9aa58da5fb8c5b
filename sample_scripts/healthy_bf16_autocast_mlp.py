# Healthy: an MLP regressor trained under CPU bfloat16 autocast (weights stay float32, matmuls run
# in bfloat16). Nothing overflows: bfloat16 has float32's exponent range.
import torch
import torch.nn as nn

torch.manual_seed(0)
x = torch.randn(512, 16)
y = torch.sin(x[:, :4]).sum(dim=1, keepdim=True) + 0.1 * x[:, 4:8].pow(2).sum(dim=1, keepdim=True)
model = nn.Sequential(nn.Linear(16, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 64), nn.GELU(), nn.Linear(64, 1))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

for epoch in range(15):
    for i in range(0, 512, 64):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            pred = model(x[i : i + 64])
            loss = nn.functional.mse_loss(pred.float(), y[i : i + 64])
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
