# Healthy: a small CNN with BatchNorm on synthetic 16x16 "digit" images served by a DataLoader
# with two worker processes; evaluated in eval() mode at the end of each epoch.
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def make_data(n, generator):
    labels = torch.randint(0, 4, (n,), generator=generator)
    images = torch.randn(n, 1, 16, 16, generator=generator) * 0.3
    for k in range(4):
        r, c = divmod(k, 2)
        images[labels == k, :, r * 8 : r * 8 + 8, c * 8 : c * 8 + 8] += 1.0
    return TensorDataset(images, labels)


def main():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    train_loader = DataLoader(make_data(512, g), batch_size=32, shuffle=True, num_workers=2, generator=g)
    val_x, val_y = make_data(128, g).tensors
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(16, 4),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(3):
        model.train()
        for images, labels in train_loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            acc = (model(val_x).argmax(dim=1) == val_y).float().mean()
        print(f"epoch {epoch} loss {loss.item():.4f} val_acc {acc.item():.3f}")


if __name__ == "__main__":
    main()
