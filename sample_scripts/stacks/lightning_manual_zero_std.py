# Demand forecaster with Lightning manual optimization (gradient accumulation by hand).
# Each batch is z-scored per feature inside training_step; the "holiday" flag column is 0
# for every store in this data set, its std is 0, and (x - mean) / std is 0/0 = NaN.
import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

L.seed_everything(0, verbose=False)


class DemandModel(L.LightningModule):
    def __init__(self, n_features=5, hidden=32, accumulate=2):
        super().__init__()
        self.automatic_optimization = False
        self.accumulate = accumulate
        self.net = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt = self.optimizers()
        x = (x - x.mean(dim=0)) / x.std(dim=0)
        loss = F.mse_loss(self.net(x).squeeze(-1), y)
        self.manual_backward(loss / self.accumulate)
        if (batch_idx + 1) % self.accumulate == 0:
            self.clip_gradients(opt, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
            opt.step()
            opt.zero_grad()
        self.log("train_loss", loss, on_epoch=True, on_step=False)

    def on_train_epoch_end(self):
        print(f"epoch {self.current_epoch} loss {self.trainer.callback_metrics['train_loss'].item():.4f}")

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


g = torch.Generator().manual_seed(0)
n = 512
price = 2 + 8 * torch.rand(n, generator=g)
promo = (torch.rand(n, generator=g) < 0.3).float()
temperature = 15 + 10 * torch.randn(n, generator=g)
weekday = torch.randint(0, 7, (n,), generator=g).float()
holiday = torch.zeros(n)  # no holidays in this quarter
x = torch.stack([price, promo, temperature, weekday, holiday], dim=1)
y = 50 - 3 * price + 12 * promo + 0.4 * temperature + torch.randn(n, generator=g)
loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
trainer = L.Trainer(max_epochs=4, accelerator="cpu", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(DemandModel(), loader)
