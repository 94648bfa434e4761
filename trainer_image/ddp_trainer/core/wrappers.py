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
    """The class name of the user's model (``GPT``, not ``OptimizedModule``, ``DistributedDataParallel`` or
    FSDP2's ``FSDPGPT``):
    what the trainer's lines and the ``model`` label of ``ddp_info`` say."""
    mro = [cls.__name__ for cls in type(inner(model)).__mro__]
    # fully_shard swaps the class for FSDP<Class>(FSDPModule, Class): the user's is the one after FSDPModule
    return mro[2] if mro[1:2] == ["FSDPModule"] and len(mro) > 2 else mro[0]
