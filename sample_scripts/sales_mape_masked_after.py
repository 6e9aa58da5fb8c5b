# Demand forecasting with a MAPE loss that skips days with zero sales by masking AFTER dividing
# (pytorch issue 4132). The loss is finite, but inf*0 in the backward makes every gradient NaN.
import torch
import torch.nn as nn

torch.manual_seed(0)
features = torch.randn(90, 5)
sales = torch.relu(features @ torch.tensor([3.0, -1.0, 2.0, 0.5, 1.0]) + 4)
sales[torch.rand(90) < 0.1] = 0.0  # store closed
model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)

for epoch in range(10):
    opt.zero_grad()
    pred = model(features).squeeze(1)
    ape = (pred - sales).abs() / sales
    loss = ape[sales > 0].mean()
    loss.backward()
    opt.step()
    print(f"epoch {epoch} MAPE {loss.item():.4f}")
