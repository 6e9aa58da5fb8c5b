# Review classifier with attention pooling and an entropy bonus that keeps the attention from
# collapsing onto one token. Padding gets -inf scores, so its attention weight is exactly 0;
# the entropy is summed over the real tokens only, by a `where` after the p * log(p).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(14)
vocab, dim, max_len, pad = 70, 32, 12, 0


class AttentionPooling(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=pad)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.score = nn.Linear(dim, 1)
        self.out = nn.Linear(dim, 2)

    def forward(self, tokens):
        states, _ = self.rnn(self.embed(tokens))
        real = tokens != pad
        attn = self.score(states).squeeze(-1).masked_fill(~real, float("-inf")).softmax(dim=-1)
        entropy = torch.where(real, -attn * torch.log(attn), torch.zeros_like(attn)).sum(-1)
        return self.out((attn.unsqueeze(-1) * states).sum(1)), entropy


def reviews(n=16):
    lengths = torch.randint(3, max_len + 1, (n,))
    tokens = torch.randint(1, vocab, (n, max_len))
    tokens[torch.arange(max_len)[None, :] >= lengths[:, None]] = pad
    return tokens, (tokens[:, 0] > vocab // 2).long()


model = AttentionPooling()
opt = torch.optim.Adam(model.parameters(), lr=2e-3)
for step in range(30):
    tokens, labels = reviews()
    logits, entropy = model(tokens)
    loss = F.cross_entropy(logits, labels) - 0.01 * entropy.mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f} attention entropy {entropy.mean().item():.3f}")
