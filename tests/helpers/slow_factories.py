"""User model factories for the tests (``--model=slow_factories:slow_mlp``): the built-in MLP, made slow
enough (a sleep per forward) that a test can scrape metrics and send signals while it trains; and
``slow_until_full``, slow only in a world smaller than :data:`FULL_WORLD`, so a test of a lost node can wait
for its replacement to grow the world back instead of racing the run's end."""

from __future__ import annotations

import os
import time

import torch

from ddp_trainer.core.config import TrainerConfig
from ddp_trainer.train.model import MLP

SLEEP_SECONDS = 0.03
FULL_WORLD = 3
"""The world ``slow_until_full`` trains at full speed in (the local elastic tests' three pods)."""
BELOW_FULL_SLEEP_SECONDS = 0.5
"""A forward's sleep in a smaller world: 200 steps there take 100 s or more, the time a replacement pod
has to join (it needs ~10 s, the Job controller's back-off, plus its start)."""


class SlowMLP(MLP):
    def __init__(self, sleep: float = SLEEP_SECONDS) -> None:
        super().__init__()
        self.sleep = sleep

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.sleep)
        return super().forward(x)


def slow_mlp(config: TrainerConfig) -> torch.nn.Module:
    return SlowMLP()


def slow_until_full(config: TrainerConfig) -> torch.nn.Module:
    """The built-in MLP at full speed in a world of :data:`FULL_WORLD`, and each forward
    :data:`BELOW_FULL_SLEEP_SECONDS` slower in a smaller one (each world builds its model anew)."""
    world = int(os.environ.get("WORLD_SIZE", str(FULL_WORLD)))
    return SlowMLP(BELOW_FULL_SLEEP_SECONDS) if world < FULL_WORLD else MLP()


PACED_SECONDS = 0.2
"""``paced``'s forward sleep in a world of :data:`FULL_WORLD` built before its gate opened: at most 5 steps a
second there, however idle the machine, so that a test's drills in the full world end before the run does."""
PACED_UNTIL_ENV = "SLOW_FACTORIES_PACED_UNTIL"
"""A file: a full world built once it exists trains at full speed (the drills are over)."""


def paced(config: TrainerConfig) -> torch.nn.Module:
    """:func:`slow_until_full`, but paced in the full world too (:data:`PACED_SECONDS` a forward) until the
    file :data:`PACED_UNTIL_ENV` names exists."""
    world = int(os.environ.get("WORLD_SIZE", str(FULL_WORLD)))
    if world < FULL_WORLD:
        return SlowMLP(BELOW_FULL_SLEEP_SECONDS)
    until = os.environ.get(PACED_UNTIL_ENV, "")
    return MLP() if until and os.path.exists(until) else SlowMLP(PACED_SECONDS)
