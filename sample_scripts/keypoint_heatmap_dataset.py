# Keypoint detection: each sample's Gaussian heatmap is scaled to peak 1 by dividing by its max.
# One image has its keypoint outside the crop, its heatmap is all zero, and 0/0 makes it NaN.
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)


class KeypointDataset(Dataset):
    def __init__(self, n=24, size=20):
        self.images = torch.rand(n, 3, size, size)
        self.points = torch.randint(2, size - 2, (n, 2)).float()
        self.points[9] = torch.tensor([-50.0, -50.0])  # keypoint outside the crop
        ys, xs = torch.meshgrid(torch.arange(float(size)), torch.arange(float(size)), indexing="ij")
        self.grid = torch.stack([ys, xs])

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        d2 = ((self.grid - self.points[i].view(2, 1, 1)) ** 2).sum(0)
        heat = torch.exp(-d2 / (2 * 1.5**2))
        heat = heat / heat.max()
        return self.images[i], heat.unsqueeze(0)


model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 1, 3, padding=1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
loader = DataLoader(KeypointDataset(), batch_size=6, shuffle=False, num_workers=0)
for epoch in range(3):
    for images, heatmaps in loader:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(images), heatmaps)
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.5f}")
