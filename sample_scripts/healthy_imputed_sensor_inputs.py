# Healthy: sensor readings with missing values (NaN) arrive from numpy; the script imputes
# them with the column mean before the model ever sees them.
import numpy as np
import torch
import torch.nn as nn

rng = np.random.default_rng(0)
readings = rng.normal(20, 5, (400, 6)).astype(np.float32)
readings[rng.random((400, 6)) < 0.05] = np.nan  # dropped samples
target = np.nan_to_num(readings[:, :1], nan=20.0) * 0.5 + 1

x = torch.from_numpy(readings)
column_mean = torch.nanmean(x, dim=0)
x = torch.where(torch.isnan(x), column_mean, x)  # imputed
x = (x - x.mean(0)) / x.std(0)
y = torch.from_numpy(target)

model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(60):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
print(f"final loss {loss.item():.4f}")
