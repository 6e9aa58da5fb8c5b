# Healthy: an early-stopping loop that tracks the best validation accuracy and the per-class max
# logit in tensors initialised with float("-inf") and updated with torch.maximum.
import torch
import torch.nn as nn

torch.manual_seed(0)
x = torch.randn(400, 10)
y = (x[:, :3].sum(dim=1) > 0).long() + (x[:, 3] > 1).long()
train_x, train_y, val_x, val_y = x[:300], y[:300], x[300:], y[300:]
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
opt = torch.optim.Adam(model.parameters(), lr=5e-3)

best_acc = torch.full((), float("-inf"))
max_logit = torch.full((3,), float("-inf"))
patience = 0
for epoch in range(40):
    opt.zero_grad()
    logits = model(train_x)
    loss = nn.functional.cross_entropy(logits, train_y)
    loss.backward()
    opt.step()
    with torch.no_grad():
        max_logit = torch.maximum(max_logit, logits.max(dim=0).values)
        acc = (model(val_x).argmax(dim=1) == val_y).float().mean()
    if acc > best_acc:
        best_acc = torch.maximum(best_acc, acc)
        patience = 0
    else:
        patience += 1
        if patience >= 8:
            break
    print(f"epoch {epoch} loss {loss.item():.4f} val_acc {acc.item():.3f} best {best_acc.item():.3f}")
print("max logit per class", max_logit.tolist())
