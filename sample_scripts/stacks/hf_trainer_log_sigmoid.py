# Multi-label tagging of support tickets with a tiny BERT (built from a config) and the
# Hugging Face Trainer. compute_loss is overridden with a hand-written binary cross-entropy on
# sigmoid probabilities; the "billing" tag is on every ticket, its logit keeps growing, sigmoid
# rounds to exactly 1.0 in float32, and log(1 - p) = log(0) = -inf (0 * -inf = NaN in the loss).
import torch
from transformers import (BertConfig, BertForSequenceClassification, PrinterCallback, Trainer, TrainerCallback,
                          TrainingArguments, set_seed)

set_seed(0)

VOCAB, SEQ, TAGS = 64, 12, 4


class TicketDataset(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(10, VOCAB, (n, SEQ), generator=g)
        self.ids[:, 0] = 2  # [CLS]
        self.tags = torch.zeros(n, TAGS)
        self.tags[:, 0] = 1.0  # "billing": every ticket in this export
        for t in range(1, TAGS):  # tag t when its keyword (token 4 + t) occurs
            has = torch.rand(n, generator=g) < 0.4
            self.ids[has, t] = 4 + t
            self.tags[has, t] = 1.0

    def __len__(self):
        return len(self.tags)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": self.tags[i]}


class TaggingTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        probs = torch.sigmoid(outputs.logits)
        loss = -(labels * torch.log(probs) + (1 - labels) * torch.log(1 - probs)).mean()
        return (loss, outputs) if return_outputs else loss


class EpochLossPrinter(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            print(f"epoch {state.epoch:.0f} loss {logs['loss']:.4f} grad_norm {logs.get('grad_norm', float('nan')):.4f}")


config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=SEQ, num_labels=TAGS,
                    problem_type="multi_label_classification")
model = BertForSequenceClassification(config)
args = TrainingArguments(output_dir="/tmp/hf_trainer_out", num_train_epochs=2, per_device_train_batch_size=8,
                         learning_rate=1e-1, lr_scheduler_type="constant", logging_strategy="epoch",
                         save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, seed=0)
trainer = TaggingTrainer(model=model, args=args, train_dataset=TicketDataset(192, seed=1),
                         callbacks=[EpochLossPrinter()])
trainer.remove_callback(PrinterCallback)  # the per-epoch line above instead of raw log dicts
result = trainer.train()
print(f"final train loss {result.training_loss:.4f}")
