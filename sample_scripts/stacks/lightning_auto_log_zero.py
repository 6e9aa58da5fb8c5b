# Churn classifier as a LightningModule (automatic optimization). The features are raw
# (account age in days, monthly spend...) and the loss is a hand-written binary cross-entropy
# on sigmoid probabilities: large logits make sigmoid exactly 1.0 in float32, and log(1 - p)
# is log(0) = -inf.
import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

L.seed_everything(0, verbose=False)


class ChurnModel(L.LightningModule):
    def __init__(self, n_features=4, hidden=32, lr=1e-2):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        p = torch.sigmoid(self(x))
        loss = -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()
        self.log("train_loss", loss, on_epoch=True, on_step=False)
        return loss

    def on_train_epoch_end(self):
        print(f"epoch {self.current_epoch} loss {self.trainer.callback_metrics['train_loss'].item():.4f}")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


g = torch.Generator().manual_seed(0)
age_days = torch.randint(1, 3000, (512, 1), generator=g).float()
spend = torch.rand(512, 1, generator=g) * 400
tickets = torch.randint(0, 12, (512, 1), generator=g).float()
tenure = torch.randint(1, 96, (512, 1), generator=g).float()
x = torch.cat([age_days, spend, tickets, tenure], dim=1)
y = ((tickets[:, 0] > 6) | (spend[:, 0] < 50)).float()
loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
trainer = L.Trainer(max_epochs=4, accelerator="cpu", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(ChurnModel(), loader)
