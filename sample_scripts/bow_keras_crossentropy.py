# Bag-of-words topic classifier with a Softmax output layer and a Keras-style hand-written
# categorical cross-entropy log(softmax). Raw word counts give huge logits: softmax underflows to 0.
import torch
import torch.nn as nn

torch.manual_seed(0)
vocab, topics = 300, 5
counts = torch.poisson(torch.rand(256, vocab) * 20)
labels = torch.randint(0, topics, (256,))
y_onehot = nn.functional.one_hot(labels, topics).float()


def categorical_crossentropy(y_true, y_pred):
    return -(y_true * torch.log(y_pred)).sum(dim=1).mean()


model = nn.Sequential(nn.Linear(vocab, 64), nn.ReLU(), nn.Linear(64, topics), nn.Softmax(dim=1))
opt = torch.optim.RMSprop(model.parameters(), lr=0.01)
for epoch in range(20):
    for i in range(0, 256, 64):
        opt.zero_grad()
        loss = categorical_crossentropy(y_onehot[i : i + 64], model(counts[i : i + 64]))
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
