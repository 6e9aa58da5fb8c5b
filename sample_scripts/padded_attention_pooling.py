# Sentence classifier with attention pooling over padded token sequences. Padding positions get
# -inf scores; one batch row is an empty sentence (all padding), so softmax of all -inf is NaN.
import torch
import torch.nn as nn

torch.manual_seed(0)
vocab, dim, max_len = 100, 32, 12
lengths = torch.tensor([12, 7, 9, 0, 5, 11, 3, 8])  # sentence 3 is empty after cleaning
tokens = torch.randint(1, vocab, (8, max_len))
padding = torch.arange(max_len)[None, :] >= lengths[:, None]
tokens[padding] = 0
labels = torch.randint(0, 2, (8,))


class AttnPoolClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.score = nn.Linear(dim, 1)
        self.out = nn.Linear(dim, 2)

    def forward(self, tokens, padding):
        h = self.embed(tokens)
        scores = self.score(h).squeeze(-1).masked_fill(padding, float("-inf"))
        weights = torch.softmax(scores, dim=1)
        return self.out((weights.unsqueeze(-1) * h).sum(dim=1))


model = AttnPoolClassifier()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(10):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(tokens, padding), labels)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
