# Broken: features are standardised up front, before the model exists; one feature column
# is constant (a sensor stuck at its default), so its std is 0 and 0/0 makes it NaN.
import torch
import torch.nn as nn

torch.manual_seed(0)
raw = torch.randn(500, 5) * 3 + 10
raw[:, 3] = 1.0  # stuck sensor
features = (raw - raw.mean(0)) / raw.std(0)
labels = (raw[:, 0] > 10).float().unsqueeze(1)

model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(30):
    opt.zero_grad()
    loss = nn.functional.binary_cross_entropy_with_logits(model(features), labels)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
