# Broken: a gradient hook rescales each embedding row's gradient to unit norm. Rows of tokens
# absent from the batch get an all-zero gradient, and 0 / 0 in the hook makes them NaN.
import torch
import torch.nn as nn

torch.manual_seed(0)
vocab, dim = 50, 8
emb = nn.Embedding(vocab, dim)
head = nn.Linear(dim, 1)


def unit_rows(grad):
    return grad / grad.norm(dim=1, keepdim=True)


emb.weight.register_hook(unit_rows)
opt = torch.optim.SGD(list(emb.parameters()) + list(head.parameters()), lr=0.1)
tokens = torch.randint(0, 40, (64, 5))  # ids 40..49 never occur
target = torch.randn(64, 1)
for step in range(5):
    opt.zero_grad()
    loss = nn.functional.mse_loss(head(emb(tokens).mean(1)), target)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
