# Insurance claim-rate model. The Dataset turns each policy's claim count and exposure
# (years insured) into a rate in __getitem__; a DataLoader with two worker processes started
# with the spawn method (multiprocessing_context="spawn", as on macOS and Windows) batches
# them. Policy 37 was cancelled on the day it started: its exposure is 0 years,
# claims/exposure is 0/0 = NaN, and the batch holding it reaches the model with a NaN target.
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class PolicyDataset(Dataset):
    def __init__(self, n=384, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.features = torch.randn(n, 6, generator=g)
        self.exposure = 0.25 + 4.75 * torch.rand(n, generator=g)  # years
        risk = torch.exp(0.3 * self.features[:, 0] - 0.2 * self.features[:, 1])
        self.exposure[37] = 0.0  # cancelled on the first day
        self.claims = torch.poisson(0.2 * risk * self.exposure, generator=g)

    def __len__(self):
        return len(self.exposure)

    def __getitem__(self, i):
        rate = self.claims[i] / self.exposure[i]
        return self.features[i], rate


def main():
    torch.manual_seed(0)
    loader = DataLoader(PolicyDataset(), batch_size=32, shuffle=True, num_workers=2,
                        multiprocessing_context="spawn", persistent_workers=True)
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    for epoch in range(3):
        for features, rate in loader:
            opt.zero_grad()
            loss = F.mse_loss(model(features).squeeze(-1), rate)
            loss.backward()
            opt.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
