"""The built-in model and the loss a run trains with (:mod:`ddp_trainer.train.model`)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ddp_trainer.core.config import TrainerConfig
from ddp_trainer.train.model import MLP, build_model, compute_loss


class OwnLoss(nn.Linear):
    """A model that brings its own loss."""

    def compute_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (output.sum(dim=1) - target.float()).pow(2).mean()


class Wrapper(nn.Module):
    """What DDP looks like from outside: the model under ``.module``, no attribute forwarding."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.module(x)
        return out


def test_the_loss_is_cross_entropy_unless_the_model_brings_its_own() -> None:
    x, y = torch.randn(6, 32), torch.tensor([0, 1, 2, 3, 4, 5])
    mlp = MLP()
    assert torch.equal(compute_loss(mlp, mlp(x), y), F.cross_entropy(mlp(x), y))
    own = OwnLoss(32, 2)
    assert torch.equal(compute_loss(own, own(x), y), own.compute_loss(own(x), y))


def test_the_models_own_loss_is_found_through_the_ddp_wrapper() -> None:
    own = OwnLoss(32, 2)
    wrapped = Wrapper(own)
    x, y = torch.randn(6, 32), torch.tensor([0, 1, 0, 1, 0, 1])
    assert torch.equal(compute_loss(wrapped, wrapped(x), y), own.compute_loss(own(x), y))


def test_the_model_factory_is_resolved_and_a_bad_one_is_named() -> None:
    assert isinstance(build_model(TrainerConfig()), MLP)
    with pytest.raises(ValueError, match="--model"):
        build_model(TrainerConfig(model="no_such_module:build"))
    with pytest.raises(TypeError, match=r"returned str, not a torch\.nn\.Module"):
        build_model(TrainerConfig(model="builtins:str"))
