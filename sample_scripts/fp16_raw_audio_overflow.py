# Voice-activity detection in half precision (float16): per-frame log energy is computed from raw
# int16 PCM samples (+-32767) instead of [-1, 1] waveforms, so x**2 passes float16's max 65504.
import torch
import torch.nn as nn

torch.manual_seed(0)
t = torch.arange(64 * 400) / 16000
speech = (torch.rand(64) > 0.5).float()
amplitude = 200 + 12000 * speech.repeat_interleave(400)
pcm = (torch.sin(2 * torch.pi * 440 * t) * amplitude + torch.randn(64 * 400) * 100).round()
frames = pcm.view(64, 400).half()

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).half()
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
for step in range(20):
    opt.zero_grad()
    energy = (frames**2).view(64, 8, 50).mean(dim=-1)
    logit = model(torch.log1p(energy)).squeeze(1)
    loss = nn.functional.binary_cross_entropy_with_logits(logit.float(), speech)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
