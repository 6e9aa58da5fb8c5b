# DP-SGD style training of a small embedding net with a triplet loss. Per-sample
# gradients come from torch.func.vmap(torch.func.grad(...)) over functional_call, each one is
# clipped to norm 1, noise is added, and the mean goes into p.grad for torch.optim.SGD.
# The distance is a plain sqrt of the squared difference, and the positive sampler can return
# the anchor itself: that triplet's distance is exactly 0, sqrt's derivative 1/(2*sqrt(0)) is
# Inf, and its per-sample gradient is NaN (0 * Inf).
import torch
import torch.nn as nn
from torch.func import functional_call, grad, vmap

torch.manual_seed(0)

n_items, dim = 64, 16
items = torch.randn(n_items, dim)
classes = torch.arange(n_items) % 8
model = nn.Sequential(nn.Linear(dim, 32), nn.Tanh(), nn.Linear(32, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
max_norm, noise = 1.0, 0.05


def triplet_loss(params, anchor, positive, negative):
    ea, ep, en = functional_call(model, params, (torch.stack([anchor, positive, negative]),))
    d_pos = torch.sqrt(((ea - ep) ** 2).sum())
    d_neg = torch.sqrt(((ea - en) ** 2).sum())
    return torch.relu(d_pos - d_neg + 0.5)


def sample_triplets(batch):
    a = torch.randint(0, n_items, (batch,))
    p = (a + 8 * torch.randint(0, n_items // 8, (batch,))) % n_items  # same class
    neg = (a + torch.randint(1, 8, (batch,))) % n_items  # another class
    return items[a], items[p], items[neg]


per_sample_grads = vmap(grad(triplet_loss), in_dims=(None, 0, 0, 0))
for epoch in range(4):
    for _ in range(10):
        params = {k: v.detach() for k, v in model.named_parameters()}
        a, p, neg = sample_triplets(32)
        grads = per_sample_grads(params, a, p, neg)
        norms = torch.sqrt(sum((g.flatten(1) ** 2).sum(1) for g in grads.values()))
        factor = (max_norm / (norms + 1e-6)).clamp(max=1.0)
        for name, param in model.named_parameters():
            clipped = (grads[name] * factor.view(-1, *[1] * (grads[name].dim() - 1))).mean(0)
            param.grad = clipped + noise * max_norm / 32 * torch.randn_like(clipped)
        opt.step()
    with torch.no_grad():
        loss = vmap(triplet_loss, in_dims=(None, 0, 0, 0))(params, a, p, neg).mean()
    print(f"epoch {epoch} loss {loss.item():.4f}")
