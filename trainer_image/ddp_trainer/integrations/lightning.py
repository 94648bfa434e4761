"""Sync health for Lightning: ``lightning.pytorch.Trainer(..., callbacks=[SyncHealthCallback()])``.

The callback builds a :class:`ddp_trainer.sync.health.SyncHealth` when training starts (the LightningModule,
the first optimizer, the total from ``max_steps`` or the estimated stepping batches, whether the DDP
wrapper broadcasts buffers) and calls it after each batch that ended with an optimizer step; an exception
in training writes the report. The compute probe runs ``training_step`` on the first batch rank 0 saw
(once every ``probeEverySteps`` steps, in eval mode; what that call logs is logged). Keyword arguments go
to ``SyncHealth`` (``every=``, ``on_divergence=``, ..., or ``config=``, a ``SyncHealth.Config``, whose total,
step and buffer setting the Trainer's replace unless given as keywords).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import lightning
import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from ddp_trainer.integrations import distributed, require
from ddp_trainer.sync.health import SyncHealth, config_of

MIN_VERSION = (2, 4)
require("lightning", lightning.__version__, MIN_VERSION, "ddp_trainer.integrations.lightning")


def batch_size(batch: Any) -> int:
    """The number of samples in a batch: the first dimension of its first tensor (0 when there is none)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, Mapping):
        return next((batch_size(v) for v in batch.values() if batch_size(v)), 0)
    if isinstance(batch, Sequence) and not isinstance(batch, str):
        return next((batch_size(v) for v in batch if batch_size(v)), 0)
    return 0


def probe_step(module: torch.nn.Module, batch: Any) -> Any:
    """How the compute probe runs a batch of a LightningModule: its ``training_step`` (whose ``forward``
    may not exist); what it returns (a loss, or a dict with one) is the probe's scalar."""
    assert isinstance(module, LightningModule), type(module)
    return module.training_step(batch, 0)


class SyncHealthCallback(Callback):  # type: ignore[misc]
    """Checks that every rank holds the same model while a Lightning ``Trainer`` trains."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.health: SyncHealth | None = None
        self.seen = 0

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not distributed():
            return
        optimizers = list(trainer.optimizers)
        total: int | None = None
        if trainer.max_steps and trainer.max_steps > 0:
            total = int(trainer.max_steps)
        elif math.isfinite(float(trainer.estimated_stepping_batches)):
            total = int(trainer.estimated_stepping_batches)
        options = {
            "total_steps": total,
            "broadcast_buffers": getattr(trainer.strategy.model, "broadcast_buffers", None),
            "start_step": trainer.global_step,
            "probe_step": probe_step,
            **self.options,
        }
        self.seen = trainer.global_step
        config, others = config_of(options)
        self.health = SyncHealth(pl_module, optimizers[0] if optimizers else None, config, **others)

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.health is not None and self.health.prober is not None:
            self.health.prober.offer(batch)  # the probe's batch: the first one (rank 0's is used)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.health is None or trainer.global_step == self.seen:  # accumulating: no optimizer step
            return
        self.seen = trainer.global_step
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        self.health.step(loss if isinstance(loss, torch.Tensor | float) else None, batch_size(batch))

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.health is not None:
            self.health.close()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if self.health is not None:
            self.health.close(exception)
