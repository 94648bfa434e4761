"""The silent-data-corruption fire drill: ``DDPJOB_CHAOS_SDC="rank=R,step=S"`` makes rank R compute wrong.

:func:`install_sdc_drill` hooks the forward of the unwrapped model's last layer on rank R and, after step
S (from step S + 1 on, and in every compute probe from step S), scales one element of its output as a
flip of that element's highest mantissa bit would move it. It happens before DDP's all-reduce, so the
corrupted gradient is averaged into every replica: the replica check sees identical models, and only the
compute probe (:mod:`ddp_trainer.sync.probe`) can name rank R.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

_INT_OF = {torch.float64: torch.int64, torch.float32: torch.int32, torch.bfloat16: torch.int16}
_INT_OF[torch.float16] = torch.int16


def flip_bit(value: torch.Tensor) -> torch.Tensor:
    """A copy of ``value`` with the highest mantissa bit of its first element flipped (a silent data
    corruption: the value moves by up to half of itself, and stays finite)."""
    out = value.detach().clone().contiguous()
    mantissa = round(-math.log2(torch.finfo(value.dtype).eps))
    word = out.view(-1)[:1].view(_INT_OF[value.dtype])
    word ^= 1 << (mantissa - 1)
    return out


def corrupt(value: torch.Tensor) -> torch.Tensor:
    """``value`` with its first element scaled as :func:`flip_bit` moves it, keeping the autograd graph,
    so the gradients that flow through that element are corrupted too."""
    if value.numel() == 0 or value.dtype not in _INT_OF:
        return value
    original = float(value.detach().reshape(-1)[0])
    changed = float(flip_bit(value).reshape(-1)[0])
    factor = changed / original if original != 0 and math.isfinite(changed / original) else 1.5
    scale = torch.ones_like(value)
    scale.view(-1)[0] = factor
    return value * scale


def _corrupt_output(output: Any) -> Any:
    if isinstance(output, torch.Tensor):
        return corrupt(output)
    if isinstance(output, Mapping) and isinstance(output.get("loss"), torch.Tensor):
        output["loss"] = corrupt(output["loss"])  # type: ignore[index]
        return output
    if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
        return (corrupt(output[0]), *output[1:])
    return output


def install_sdc_drill(model: nn.Module, active: Callable[[], bool]) -> Any:
    """Corrupt the output of the model's last layer (:func:`last_layer`) on this rank while ``active()``
    says so; returns the hook handle. Inside the unwrapped module: before DDP's all-reduce."""

    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        return _corrupt_output(output) if active() else output

    inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    return last_layer(inner).register_forward_hook(hook)


def last_layer(model: nn.Module) -> nn.Module:
    """The last submodule (in definition order) that holds parameters of its own: its output feeds the loss
    most directly, and it runs whatever calls the model (``forward``, a Lightning ``training_step``)."""
    owners = [m for m in model.modules() if next(m.parameters(recurse=False), None) is not None]
    return owners[-1] if owners else model
