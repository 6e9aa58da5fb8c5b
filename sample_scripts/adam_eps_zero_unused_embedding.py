# Next-token model trained with Adam(eps=0) "for exactness". Some vocabulary rows never occur in
# the data, their gradient is exactly 0, and Adam's update 0 / (sqrt(0) + 0) is NaN.
import torch
import torch.nn as nn

torch.manual_seed(0)
vocab, dim = 40, 16
corpus = torch.randint(0, 30, (64, 9))  # tokens 30..39 are reserved and never appear


class BigramModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, tokens):
        return self.out(torch.tanh(self.embed(tokens)))


model = BigramModel()
opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=0.0)
for step in range(10):
    logits = model(corpus[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), corpus[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
