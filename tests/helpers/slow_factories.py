"""User model factories for the tests (``--model=slow_factories:slow_mlp``): the built-in MLP, made slow
enough (a sleep per forward) that a test can scrape metrics and send signals while it trains; and
``slow_until_full``, slow only in a world smaller than :data:`FULL_WORLD`, so a test of a lost node can wait
for its replacement to grow the world back instead of racing the run's end."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from ddp_trainer.core.config import TrainerConfig
from ddp_trainer.train.model import MLP

SLEEP_SECONDS = 0.03
FULL_WORLD = 3
"""The world ``slow_until_full`` trains at full speed in (the local elastic tests' three pods)."""
BELOW_FULL_SLEEP_SECONDS = 0.5
"""A forward's sleep in a smaller world: 200 steps there take 100 s or more, the time a replacement pod
has to join (it needs ~10 s, the Job controller's back-off, plus its start)."""


FAST_AFTER_ENV = "SLOW_FACTORIES_FAST_AFTER"
"""A file: once it exists, ``slow_mlp`` trains at full speed. A test opens this gate once it saw what the
slow pace was for (a resize, a Pending pod), so the run's remaining steps do not keep the suite waiting."""


class SlowMLP(MLP):
    def __init__(self, sleep: float = SLEEP_SECONDS, fast_after: str = "") -> None:
        super().__init__()
        self.sleep = sleep
        self.fast_after = fast_after

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sleep and self.fast_after and os.path.exists(self.fast_after):
            self.sleep = 0.0  # the gate opened: full speed from now on
        if self.sleep:
            time.sleep(self.sleep)
        return super().forward(x)


def slow_mlp(config: TrainerConfig) -> torch.nn.Module:
    """The built-in MLP, :data:`SLEEP_SECONDS` slower a forward until the file :data:`FAST_AFTER_ENV` names
    exists (where it names one)."""
    return SlowMLP(fast_after=os.environ.get(FAST_AFTER_ENV, ""))


class SlowUntilFull(MLP):
    """The built-in MLP, each forward :data:`BELOW_FULL_SLEEP_SECONDS` slower while the process group is
    smaller than :data:`FULL_WORLD`: asked at each forward, since a world healed in place (issue 57) keeps
    the model it built in a larger one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        world = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "3"))
        if world < FULL_WORLD:
            time.sleep(BELOW_FULL_SLEEP_SECONDS)
        return super().forward(x)


def slow_until_full(config: TrainerConfig) -> torch.nn.Module:
    """The built-in MLP at full speed in a world of :data:`FULL_WORLD`, and each forward
    :data:`BELOW_FULL_SLEEP_SECONDS` slower in a smaller one (:class:`SlowUntilFull`)."""
    return SlowUntilFull()


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
