"""A tiny Hugging Face `Trainer` DDP job on CPU (gloo): a one-layer BERT built from a config on random tokens, nothing
downloaded. Only rank 0 has a progress bar; no rank prints per-step lines.

Knobs for the tests, by environment: HF_STEPS (default 30), HF_SLOW_RANK / HF_SLOW_S (that rank's forward sleeps
this long each step), HF_STUCK_RANK / HF_STUCK_STEP (that rank sleeps 600 s in its forward at that step),
HF_GPU=1 (each rank on its GPU, NCCL: the device check), LOSS_LINES=1 (each rank prints its own loss of each step,
which its logs have only as a mean over ranks and steps: `loss rank R step S value V`, V the float's repr).
"""

import os
import tempfile
import time

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class RandomTokens(Dataset):
    def __init__(self, length: int, vocab: int, width: int = 16):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (length, width), generator=generator)
        self.labels = torch.randint(0, 2, (length,), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.labels[index]}


class Knobs(BertForSequenceClassification):
    """The model with the tests' slow or stuck rank in its forward."""

    calls = 0

    def forward(self, *args, **kwargs):
        rank = int(os.environ.get("RANK", "0"))
        stuck = int(os.environ.get("HF_STUCK_STEP", "5"))
        if rank == int(os.environ.get("HF_STUCK_RANK", "-1")) and Knobs.calls == stuck:
            time.sleep(600)
        if rank == int(os.environ.get("HF_SLOW_RANK", "-1")):
            time.sleep(float(os.environ.get("HF_SLOW_S", "0.2")))
        Knobs.calls += 1
        return super().forward(*args, **kwargs)


class LossLines(Trainer):
    """The Trainer printing each step's loss (the value its backward was called on) when LOSS_LINES=1."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        if os.environ.get("LOSS_LINES") == "1":
            step = self.state.global_step + 1  # one micro-batch a step: counted once the optimizer stepped
            print(f"loss rank {os.environ.get('RANK')} step {step} value {float(loss)!r}", flush=True)
        return loss


def main() -> None:
    steps = int(os.environ.get("HF_STEPS", "30"))
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32)
    torch.manual_seed(0)
    model = Knobs(config)
    gpu = os.environ.get("HF_GPU") == "1"
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=steps, use_cpu=not gpu,
                                 report_to=[], save_strategy="no", logging_strategy="no",
                                 ddp_backend="nccl" if gpu else "gloo",
                                 dataloader_num_workers=0, remove_unused_columns=False,
                                 ddp_find_unused_parameters=False)
        trainer = LossLines(model=model, args=args, train_dataset=RandomTokens(4 * steps * 4, 64))
        trainer.train()
    print(f"done rank {os.environ.get('RANK')} steps {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
