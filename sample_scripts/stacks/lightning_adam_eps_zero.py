# Matrix-factorisation recommender as a LightningModule (automatic optimization). Adam is
# built in configure_optimizers with eps=0, copied from a paper's table. Items nobody in a
# batch rated get a zero gradient, so Adam's second moment stays 0 for their rows and the
# update is 0 / (sqrt(0) + 0) = NaN. Lightning's loop calls optimizer.step(), not the script.
import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

L.seed_everything(0, verbose=False)
N_USERS, N_ITEMS, DIM = 50, 200, 8


class MatrixFactorisation(L.LightningModule):
    def __init__(self, lr=1e-2):
        super().__init__()
        self.save_hyperparameters()
        self.users = nn.Embedding(N_USERS, DIM)
        self.items = nn.Embedding(N_ITEMS, DIM)

    def forward(self, u, i):
        return (self.users(u) * self.items(i)).sum(-1)

    def training_step(self, batch, batch_idx):
        u, i, r = batch
        return nn.functional.mse_loss(self(u, i), r)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr, eps=0.0)


users = torch.randint(0, N_USERS, (256,))
items = torch.randint(0, N_ITEMS // 4, (256,))  # the catalogue's tail is never rated
ratings = torch.randint(1, 6, (256,)).float()
loader = DataLoader(TensorDataset(users, items, ratings), batch_size=64, shuffle=True)
model = MatrixFactorisation()
trainer = L.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
trainer.fit(model, loader)
print(f"item embedding norm {model.items.weight.norm().item():.4f}")
