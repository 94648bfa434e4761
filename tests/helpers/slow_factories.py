"""A user model factory for the tests (``--model=slow_factories:slow_mlp``): the built-in MLP, made slow
enough (a sleep per forward) that a test can scrape metrics and send signals while it trains."""

from __future__ import annotations

import time

import torch

from ddp_trainer.core.config import TrainerConfig
from ddp_trainer.train.model import MLP

SLEEP_SECONDS = 0.03


class SlowMLP(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(SLEEP_SECONDS)
        return super().forward(x)


def slow_mlp(config: TrainerConfig) -> torch.nn.Module:
    return SlowMLP()
