# Healthy: churn classifier as a LightningModule (automatic optimization), standardised
# features, BCE-with-logits loss, a few epochs on the CPU.
import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

L.seed_everything(0, verbose=False)


class ChurnModel(L.LightningModule):
    def __init__(self, n_features=8, hidden=32, lr=1e-2):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.binary_cross_entropy_with_logits(self(x), y)
        self.log("train_loss", loss, on_epoch=True, on_step=False)
        return loss

    def on_train_epoch_end(self):
        print(f"epoch {self.current_epoch} loss {self.trainer.callback_metrics['train_loss'].item():.4f}")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


x = torch.randn(512, 8)
y = (x[:, 0] + 0.5 * x[:, 1] - x[:, 2] > 0).float()
loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
trainer = L.Trainer(max_epochs=4, accelerator="cpu", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(ChurnModel(), loader)
