# Per-channel RMS energy loss computed as mean(x**2) ** 0.5 on audio frames. One channel is
# digital silence (all zeros), so ** 0.5 is evaluated at 0 and its backward 0.5 * 0**-0.5 is inf.
import torch
import torch.nn as nn

torch.manual_seed(0)
frames = torch.randn(16, 4, 256)
frames[:, 2] = 0.0  # muted microphone channel
target_rms = torch.tensor([0.5, 0.5, 0.0, 0.5])
gain = nn.Parameter(torch.ones(4, 1))
opt = torch.optim.SGD([gain], lr=0.1)

for step in range(20):
    opt.zero_grad()
    out = frames * gain
    rms = (out**2).mean(dim=(0, 2)) ** 0.5
    loss = ((rms - target_rms) ** 2).sum()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
