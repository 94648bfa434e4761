"""The training loop: no I/O, no policy. Verification, metrics, checkpoints and signals plug in through
the ``on_step`` callback, which sees every finished optimizer step and says whether to go on.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ddp_trainer.core.state import TrainState

Batches = Iterator[tuple[Any, ...]]
"""``(epoch, inputs, targets)`` micro-batches, or ``(epoch, inputs, targets, loss weight)`` (an elastic
job's: the weight replaces ``1 / grad_accumulation``)."""
LossFn = Callable[[nn.Module, Any, torch.Tensor], torch.Tensor]
"""``loss_fn(model, outputs, targets) -> loss``: how a micro-batch's outputs become the loss."""


@dataclass(frozen=True)
class Precision:
    """How the forward runs: ``torch.amp`` autocast on cuda, plus a GradScaler for fp16."""

    device_type: str
    """``cuda`` or ``cpu``."""
    dtype: torch.dtype | None
    """Autocast dtype, or None for full precision."""

    @staticmethod
    def of(device: torch.device, name: str) -> Precision:
        """From a resolved precision name (``fp32``, ``bf16``, ``fp16``)."""
        dtypes = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
        return Precision(device.type, dtypes[name])

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """The context for forward and loss."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def scaler(self) -> torch.amp.GradScaler:
        """A GradScaler, enabled only for fp16 (bf16 and fp32 need none)."""
        return torch.amp.GradScaler(self.device_type, enabled=self.dtype == torch.float16)


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step did, handed to ``on_step``."""

    step: int
    """The step just finished (1-based, counting resumed steps)."""
    epoch: int
    """Epoch of its last micro-batch."""
    loss: torch.Tensor
    """Mean loss over its micro-batches, on this rank: a scalar on the device, not yet read (reading it
    waits for the step's kernels; :class:`ddp_trainer.core.lossread.LossReader` reads it a step later)."""
    samples: int
    """Samples this rank consumed in the step."""
    duration_seconds: float
    """Wall time of the step on this rank."""

    @property
    def finite(self) -> bool:
        """Whether the loss was finite (reads it: waits for the step on a GPU)."""
        return math.isfinite(float(self.loss))


def train(
    state: TrainState,
    batches: Batches,
    *,
    total_steps: int,
    grad_accumulation: int,
    precision: Precision,
    device: torch.device,
    loss_fn: LossFn,
    on_step: Callable[[StepResult], bool],
) -> None:
    """Run optimizer steps until ``total_steps`` or until ``on_step`` returns False.

    Each step runs ``grad_accumulation`` micro-batches; all but the last are under ``no_sync()`` so
    DDP all-reduces gradients once per step. ``loss_fn(model, outputs, targets)`` gives each
    micro-batch's loss. A plain module (no DDP) needs no process group.
    """
    model, optimizer, scaler = state.model, state.optimizer, state.scaler
    no_sync: Callable[[], contextlib.AbstractContextManager[object]] = getattr(
        model, "no_sync", contextlib.nullcontext
    )
    model.train()
    while state.step < total_steps:
        started = time.perf_counter()
        losses: list[torch.Tensor] = []
        samples = 0
        for micro in range(grad_accumulation):
            epoch, inputs, targets, *weight = next(batches)
            inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            last = micro == grad_accumulation - 1
            with contextlib.nullcontext() if last else no_sync():
                with precision.autocast():
                    loss = loss_fn(model, model(inputs), targets)
                    loss = loss * weight[0] if weight else loss / grad_accumulation
                scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
            losses.append(loss.detach())
            samples += int(targets.shape[0])
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        state.step, state.epoch = state.step + 1, epoch
        total = torch.stack(losses).sum()  # not read here: no host synchronisation per step
        result = StepResult(state.step, epoch, total, samples, time.perf_counter() - started)
        if not on_step(result):
            return
