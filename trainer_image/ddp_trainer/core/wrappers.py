"""The user's model under the wrappers scripts put around it: DDP (``.module``) and ``torch.compile``
(``OptimizedModule._orig_mod``), nested either way (nanoGPT compiles, then wraps in DDP)."""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel


def inner(model: nn.Module) -> nn.Module:
    """``model`` without its DDP and ``torch.compile`` wrappers."""
    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif type(model).__name__ == "OptimizedModule" and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod  # by name: importing torch._dynamo to compare classes costs ~1 s
        else:
            return model


def model_name(model: nn.Module) -> str:
    """The class name of the user's model (``GPT``, not ``OptimizedModule`` or ``DistributedDataParallel``):
    what the trainer's lines and the ``model`` label of ``ddp_info`` say."""
    return type(inner(model)).__name__
