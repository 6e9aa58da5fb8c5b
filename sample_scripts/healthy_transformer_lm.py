# Healthy: a two-layer causal Transformer language model on a toy repeating-pattern corpus. The
# causal mask holds float("-inf") above the diagonal on purpose; training is finite throughout.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
VOCAB, DIM, CTX = 32, 48, 20
pattern = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9])
corpus = pattern.repeat(40) % VOCAB


class CausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.zeros(CTX, DIM))
        layer = nn.TransformerEncoderLayer(DIM, nhead=4, dim_feedforward=96, dropout=0.1, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(CTX))

    def forward(self, idx):
        h = self.tok(idx) + self.pos[: idx.shape[1]]
        h = self.blocks(h, mask=self.causal[: idx.shape[1], : idx.shape[1]], is_causal=True)
        return self.head(self.norm(h))


model = CausalLM()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=40)
for step in range(40):
    starts = torch.randint(0, len(corpus) - CTX - 1, (16,))
    batch = torch.stack([corpus[s : s + CTX + 1] for s in starts])
    logits = model(batch[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}")
