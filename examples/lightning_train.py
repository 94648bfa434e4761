"""A Lightning run whose replicas are verified: one callback, nothing else changes.

A small MLP with BatchNorm (whose buffers DDP broadcasts from rank 0) on CPU with gloo. Run it on this
machine with ``ddpjob local examples/lightning.yaml`` (2 nodes × 2 processes). ``STEPS`` sets the number
of optimizer steps.
"""

from __future__ import annotations

import os

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ddp_trainer.integrations.lightning import SyncHealthCallback


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        inputs, targets = batch
        return nn.functional.mse_loss(self.net(inputs), targets)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    steps = int(os.environ.get("STEPS", "40"))
    torch.manual_seed(0)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(steps * 16 * world, 16, generator=generator)
    data = DataLoader(TensorDataset(inputs, inputs.sum(dim=1, keepdim=True)), batch_size=16)
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("PET_NNODES", "1")),
        strategy="ddp",
        callbacks=[SyncHealthCallback()],  # the one line: checks, metrics, report
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regression(), data)


if __name__ == "__main__":
    main()
