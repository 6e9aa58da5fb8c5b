# Next-hour temperature regression from weather-station CSV rows, loaded by a DataLoader with
# two worker processes. One station reported "NA" for humidity, parsed as float("nan").
import io

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

CSV = "\n".join(
    f"{12 + (i % 7) * 0.8:.1f},{55 + (i * 13) % 30},{1010 + (i * 7) % 15},{12.5 + (i % 7) * 0.8:.1f}"
    if i != 37 else "15.2,NA,1016,15.9"
    for i in range(96)
)


class StationDataset(Dataset):
    def __init__(self, text):
        self.rows = []
        for line in io.StringIO(text):
            fields = [float("nan") if v == "NA" else float(v) for v in line.strip().split(",")]
            self.rows.append(fields)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        temp, humidity, pressure, next_temp = self.rows[i]
        x = torch.tensor([temp / 30, humidity / 100, (pressure - 1013) / 10])
        return x, torch.tensor([next_temp / 30])


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(StationDataset(CSV), batch_size=16, shuffle=False, num_workers=2)
    for epoch in range(3):
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        print(f"epoch {epoch} loss {loss.item():.5f}")


if __name__ == "__main__":
    main()
