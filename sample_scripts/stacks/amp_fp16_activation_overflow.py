# Tone classifier on raw 16-bit PCM frames, trained with float16 autocast and GradScaler.
# The frames are fed unscaled (up to ~20000): the first Linear's float16 output is already
# ~27000 at step 0, grows as the weights train, and passes float16's range (-65504) at step 24
# (epoch 1): -inf in the hidden layer, NaN in the loss from then on.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = "cpu"

n = 512
labels = torch.randint(0, 4, (n,))
t = torch.arange(256.0)
freq = torch.tensor([0.02, 0.05, 0.09, 0.14])[labels]
pcm = 20000 * torch.sin(2 * torch.pi * freq[:, None] * t + torch.rand(n, 1) * 6.28) + 1000 * torch.randn(n, 256)

model = nn.Sequential(nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
scaler = torch.amp.GradScaler(device)

for epoch in range(4):
    for i in range(0, n, 32):
        frames, target = pcm[i : i + 32].to(device), labels[i : i + 32].to(device)
        opt.zero_grad()
        with torch.autocast(device, dtype=torch.float16):
            logits = model(frames)
            loss = F.cross_entropy(logits, target)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    print(f"epoch {epoch} loss {loss.item():.4f} scale {scaler.get_scale():g}")
