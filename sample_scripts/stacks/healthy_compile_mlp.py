# Healthy: a small document classifier on word-count features, compiled with torch.compile
# (default inductor backend); counts are log1p-transformed inside the compiled forward.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class DocClassifier(nn.Module):
    def __init__(self, vocab=50, hidden=32, classes=3):
        super().__init__()
        self.fc1 = nn.Linear(vocab, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, counts):
        h = torch.log1p(counts)
        return self.fc2(F.relu(self.fc1(h)))


topic_words = torch.rand(3, 50) * 3
labels = torch.randint(0, 3, (256,))
counts = torch.poisson(topic_words[labels])

model = torch.compile(DocClassifier())
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for epoch in range(5):
    for i in range(0, len(counts), 64):
        opt.zero_grad()
        loss = F.cross_entropy(model(counts[i : i + 64]), labels[i : i + 64])
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
