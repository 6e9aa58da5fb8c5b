# Speaker-embedding classifier trained with float16 autocast and GradScaler, with a
# hand-written "spread" regulariser that pushes the embeddings of a batch apart. The pairwise
# distance matrix includes the diagonal (each embedding to itself): sqrt(0) = 0 keeps the loss
# finite, but sqrt's derivative there is 1/0, so the gradients are NaN at every step whatever
# the loss scale. The scaler skips every step and halves its scale; the weights never change.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = "cpu"

n, n_speakers = 512, 8
speaker = torch.randint(0, n_speakers, (n,))
centres = torch.randn(n_speakers, 40)
features = centres[speaker] + 0.5 * torch.randn(n, 40)  # 40 log-mel averages per utterance

encoder = nn.Sequential(nn.Linear(40, 64), nn.ReLU(), nn.Linear(64, 16)).to(device)
head = nn.Linear(16, n_speakers).to(device)
opt = torch.optim.Adam([*encoder.parameters(), *head.parameters()], lr=1e-3)
scaler = torch.amp.GradScaler(device)

for epoch in range(4):
    for i in range(0, n, 32):
        x, y = features[i : i + 32].to(device), speaker[i : i + 32].to(device)
        opt.zero_grad()
        with torch.autocast(device, dtype=torch.float16):
            emb = encoder(x)
            dist = torch.sqrt(((emb[:, None, :] - emb[None, :, :]) ** 2).sum(-1))
            loss = F.cross_entropy(head(emb), y) - 0.01 * dist.mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    print(f"epoch {epoch} loss {loss.item():.4f} scale {scaler.get_scale():g}")
