"""The built-in model: a small MLP classifier for the synthetic data of :mod:`ddp_trainer.train.data`.

It has a BatchNorm layer on purpose, so that buffers updated in the forward (running statistics) and an
integer buffer (``num_batches_tracked``) go through the verification path.

The loss: ``cross_entropy(model(x), y)`` unless the model defines ``compute_loss(output, target)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ddp_trainer.core.config import TrainerConfig
from ddp_trainer.train import data
from ddp_trainer.train.factories import resolve


class MLP(nn.Module):
    """Linear → BatchNorm → ReLU → Linear → ReLU → Linear."""

    def __init__(self, features: int = data.FEATURES, hidden: int = 64, classes: int = data.CLASSES) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, hidden),
            nn.BatchNorm1d(hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


def build_mlp(config: TrainerConfig) -> nn.Module:
    """The default ``--model=mlp``."""
    return MLP()


BUILTIN_MODELS: dict[str, Callable[[TrainerConfig], nn.Module]] = {"mlp": build_mlp}


def build_model(config: TrainerConfig) -> nn.Module:
    """Build ``config.model`` (call it with the model seed already set)."""
    model = resolve(config.model, BUILTIN_MODELS, "model")(config)
    if not isinstance(model, nn.Module):
        raise TypeError(f"--model={config.model!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def compute_loss(model: nn.Module, output: Any, target: torch.Tensor) -> torch.Tensor:
    """The model's own ``compute_loss`` if it has one, else cross-entropy.

    ``model`` may be DDP-wrapped: the wrapper does not forward attributes, so the model's own loss is looked
    up on the module it wraps.
    """
    custom = getattr(getattr(model, "module", model), "compute_loss", None)
    if callable(custom):
        loss: torch.Tensor = custom(output, target)
        return loss
    return F.cross_entropy(output, target)
