# Healthy: a tiny GAN on 2-D points with Lightning manual optimization (two optimizers,
# self.manual_backward, explicit step / zero_grad).
import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

L.seed_everything(0, verbose=False)


class RingGAN(L.LightningModule):
    def __init__(self, latent=8, hidden=32):
        super().__init__()
        self.automatic_optimization = False
        self.latent = latent
        self.generator = nn.Sequential(nn.Linear(latent, hidden), nn.ReLU(), nn.Linear(hidden, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        (real,) = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(real.shape[0], self.latent)

        fake = self.generator(z)
        d_real, d_fake = self.discriminator(real), self.discriminator(fake.detach())
        d_loss = (F.binary_cross_entropy_with_logits(d_real, torch.ones_like(d_real))
                  + F.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake)))
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()

        d_gen = self.discriminator(fake)
        g_loss = F.binary_cross_entropy_with_logits(d_gen, torch.ones_like(d_gen))
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.log_dict({"d_loss": d_loss, "g_loss": g_loss}, on_epoch=True, on_step=False)

    def on_train_epoch_end(self):
        m = self.trainer.callback_metrics
        print(f"epoch {self.current_epoch} d_loss {m['d_loss'].item():.4f} g_loss {m['g_loss'].item():.4f}")

    def configure_optimizers(self):
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=2e-3, betas=(0.5, 0.999))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=2e-3, betas=(0.5, 0.999))
        return opt_g, opt_d


angle = torch.rand(1024) * 2 * torch.pi
ring = torch.stack([torch.cos(angle), torch.sin(angle)], dim=1) * 2 + 0.05 * torch.randn(1024, 2)
loader = DataLoader(TensorDataset(ring), batch_size=128, shuffle=True)
trainer = L.Trainer(max_epochs=4, accelerator="cpu", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(RingGAN(), loader)
