# Speaker-gender classifier: a float16 MLP on raw, unscaled int16 PCM frames. After two SGD
# steps the weights have grown enough that a hidden Linear's activations pass 65504 and become inf.
import torch
import torch.nn as nn

torch.manual_seed(0)
t = torch.arange(400) / 16000
pitch = torch.rand(48, 1) * 200 + 90
frames = (torch.sin(2 * torch.pi * pitch * t) * 15000 + torch.randn(48, 400) * 500).round()
labels = (pitch.squeeze(1) > 165).long()

model = nn.Sequential(nn.Linear(400, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 2))
model = model.half()
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
for step in range(10):
    opt.zero_grad()
    logits = model(frames.half())
    loss = nn.functional.cross_entropy(logits.float(), labels)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
