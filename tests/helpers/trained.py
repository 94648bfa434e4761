"""A trained state (model, optimizer, step) for the checkpoint tests, and the two ranks' identities."""

from __future__ import annotations

import torch

from ddp_trainer.checkpoint import provenance
from ddp_trainer.checkpoint.provenance import Identity, Writer
from ddp_trainer.core.config import TrainerConfig
from ddp_trainer.core.state import TrainState
from ddp_trainer.train.loop import Precision
from ddp_trainer.train.model import MLP

SETTINGS = provenance.settings_of(TrainerConfig(), 2, precision="fp32", optimizer="AdamW")


ME = Writer(Identity("team", "mine", "u1"), SETTINGS)


OTHER = Writer(Identity("team", "other", "u2"), SETTINGS)


def trained_state(step: int = 0, seed: int = 0) -> TrainState:
    torch.manual_seed(seed)
    model = MLP()
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 32)).sum().backward()
    optimizer.step()
    return TrainState(
        model, optimizer, Precision.of(torch.device("cpu"), "fp32").scaler(), step=step, epoch=1
    )
