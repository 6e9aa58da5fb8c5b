# Siamese embedding net trained with a contrastive loss on Euclidean distances.
# One "positive" pair is the same image twice, so its distance is sqrt(0): the gradient is NaN.
import torch
import torch.nn as nn

torch.manual_seed(0)

encoder = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 8))
images = torch.randn(40, 32)
left = torch.arange(0, 20)
right = torch.randint(0, 40, (20,))
right[3] = left[3]  # a duplicated image ended up paired with itself
same = (torch.rand(20) > 0.5).float()
same[3] = 1.0
margin = 2.0
opt = torch.optim.SGD(encoder.parameters(), lr=0.05)

for step in range(15):
    opt.zero_grad()
    ea, eb = encoder(images[left]), encoder(images[right])
    dist = torch.sqrt(((ea - eb) ** 2).sum(dim=1))
    loss = (same * dist**2 + (1 - same) * torch.relu(margin - dist) ** 2).mean()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
