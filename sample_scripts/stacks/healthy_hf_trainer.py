# Healthy: a tiny BERT sequence classifier built from a config (no download) trained with the
# Hugging Face Trainer on an in-memory data set of token ids: label 1 when a "positive" token
# occurs in the sentence.
import torch
from transformers import (BertConfig, BertForSequenceClassification, PrinterCallback, Trainer, TrainerCallback,
                          TrainingArguments, set_seed)

set_seed(0)

VOCAB, SEQ = 64, 12
POSITIVE = torch.tensor([5, 6, 7])


class ReviewDataset(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(10, VOCAB, (n, SEQ), generator=g)
        self.labels = (torch.rand(n, generator=g) < 0.5).long()
        where = torch.randint(1, SEQ - 2, (n,), generator=g)
        pos = self.labels == 1
        for k in range(3):  # a positive phrase: three "positive" tokens in a row
            self.ids[pos, where[pos] + k] = POSITIVE[k]
        self.ids[:, 0] = 2  # [CLS]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": self.labels[i]}


class EpochLossPrinter(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            print(f"epoch {state.epoch:.0f} loss {logs['loss']:.4f} grad_norm {logs.get('grad_norm', float('nan')):.4f}")


config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=SEQ, num_labels=2)
model = BertForSequenceClassification(config)
args = TrainingArguments(output_dir="/tmp/hf_trainer_out", num_train_epochs=3, per_device_train_batch_size=32,
                         learning_rate=3e-3, logging_strategy="epoch", save_strategy="no", report_to="none",
                         use_cpu=True, disable_tqdm=True, seed=0)
trainer = Trainer(model=model, args=args, train_dataset=ReviewDataset(192, seed=1),
                  callbacks=[EpochLossPrinter()])
trainer.remove_callback(PrinterCallback)  # the per-epoch line above instead of raw log dicts
result = trainer.train()
print(f"final train loss {result.training_loss:.4f}")
