"""A Hugging Face ``Trainer`` run whose replicas are verified: one callback, nothing else changes.

A tiny GPT-2 (random init, synthetic tokens: no download) on CPU with gloo. Run it on this machine with
``ddpjob local examples/hf-trainer.yaml`` (2 nodes × 2 processes), or ``torchrun --nproc-per-node 2
examples/hf_trainer.py``. ``STEPS`` sets the number of optimizer steps.
"""

from __future__ import annotations

import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from ddp_trainer.integrations.transformers import SyncHealthCallback


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Random token sequences, the same on every rank (the Trainer shards them)."""

    def __init__(self, count: int, length: int = 32, vocab: int = 256) -> None:
        self.data = torch.randint(vocab, (count, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.data[i], "labels": self.data[i]}


def main() -> None:
    steps = int(os.environ.get("STEPS", "40"))
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_head=2, n_embd=64, n_positions=64, vocab_size=256, bos_token_id=0, eos_token_id=0
    )
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir="hf-output",
        max_steps=steps,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        save_strategy="no",
        logging_steps=10,
        disable_tqdm=True,
    )
    world = int(os.environ.get("WORLD_SIZE", "1"))
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Tokens(steps * 8 * world),
        callbacks=[SyncHealthCallback()],  # the one line: checks, metrics, report
    )
    trainer.train()


if __name__ == "__main__":
    main()
