# Digit-glyph classifier written functionally: torch.func.grad of a loss over a parameter dict
# (functional_call) and a hand-written SGD update (no torch.optim). The 8x8 images go in as raw
# 0..255 intensities and the cross-entropy is written as log(softmax(logits)): the first update
# pushes the logits hundreds apart, softmax underflows to exactly 0 for the true class of some
# images of the second batch, and log(0) = -inf.
import torch
import torch.nn as nn
from torch.func import functional_call, grad

torch.manual_seed(0)

prototypes = torch.rand(10, 64) * 255
labels = torch.randint(0, 10, (320,))
images = (prototypes[labels] + 40 * torch.randn(320, 64)).clamp(0, 255)

model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
params = {k: v.detach().clone() for k, v in model.named_parameters()}


def cross_entropy(params, x, y):
    probs = torch.softmax(functional_call(model, params, (x,)), dim=1)
    return -torch.log(probs[torch.arange(len(y)), y]).mean()


loss_grad = grad(cross_entropy)
for epoch in range(5):
    for i in range(0, len(images), 32):
        g = loss_grad(params, images[i : i + 32], labels[i : i + 32])
        params = {k: p - 0.01 * g[k] for k, p in params.items()}
    print(f"epoch {epoch} loss {cross_entropy(params, images, labels).item():.4f}")
