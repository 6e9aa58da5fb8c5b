# Healthy: per-class recall logged each epoch as TP / (TP + FN) under no_grad. Classes absent
# from the evaluation batch give 0/0 = NaN on purpose, and torch.nanmean skips them.
import torch
import torch.nn as nn

torch.manual_seed(0)
NUM_CLASSES = 6
x = torch.randn(300, 12)
y = (x[:, :4].argmax(1)).long()  # classes 4 and 5 never occur
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, NUM_CLASSES))
opt = torch.optim.SGD(model.parameters(), lr=0.2)

for epoch in range(15):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    with torch.no_grad():
        pred = model(x).argmax(1)
        hits = torch.bincount(y[pred == y], minlength=NUM_CLASSES).float()
        support = torch.bincount(y, minlength=NUM_CLASSES).float()
        recall = hits / support
    print(f"epoch {epoch} loss {loss.item():.4f} macro recall {torch.nanmean(recall).item():.3f}")
