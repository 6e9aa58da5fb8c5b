# Handwritten-word recognition: a BiLSTM reads image columns and is trained with CTC. One word
# image was cropped to 4 columns but its transcript has 7 characters: that CTC loss is infinite.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
alphabet = "_abcdefghijklmnopqrstuvwxyz"
words = ["cat", "house", "tree", "example", "dog", "river"]
widths = torch.tensor([12, 16, 14, 4, 10, 15])  # columns per word image; "example" is cut short
T, N, H = int(widths.max()), len(words), 24
columns = torch.randn(T, N, H)
targets = torch.tensor([alphabet.index(c) for w in words for c in w])
target_lengths = torch.tensor([len(w) for w in words])


class Recognizer(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(H, 32, bidirectional=True)
        self.proj = nn.Linear(64, len(alphabet))

    def forward(self, x):
        out, _ = self.rnn(x)
        return F.log_softmax(self.proj(out), dim=-1)


model = Recognizer()
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
for step in range(8):
    opt.zero_grad()
    log_probs = model(columns)
    loss = F.ctc_loss(log_probs, targets, widths, target_lengths, blank=0)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
