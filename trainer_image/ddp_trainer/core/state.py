"""The train state: everything an optimizer step changes, and so everything a checkpoint saves and a
sync check verifies. Its own module so that the loop, checkpoints and verification share it without
importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class TrainState:
    """Everything a step changes; checkpointed and verified."""

    model: nn.Module
    """The DDP-wrapped model."""
    optimizer: torch.optim.Optimizer
    """The optimizer over the model's parameters."""
    scaler: torch.amp.GradScaler
    """Loss scaler (disabled unless fp16)."""
    step: int = 0
    """Optimizer steps done so far."""
    epoch: int = 0
    """Epoch of the last micro-batch consumed."""
