"""Sync health for the Hugging Face ``Trainer``: ``Trainer(..., callbacks=[SyncHealthCallback()])``.

The callback builds a :class:`ddp_trainer.sync.health.SyncHealth` when training begins (the model and the
optimizer from the callback's arguments, the total from ``state.max_steps``, the step from
``state.global_step`` when resuming) and calls it at the end of every optimizer step; keyword arguments
go to ``SyncHealth`` (``every=``, ``on_divergence=``, ..., or ``config=``, a ``SyncHealth.Config``, whose
total, step and buffer setting the Trainer's replace unless given as keywords). The last logged loss
feeds ``ddp_loss``.
"""

from __future__ import annotations

from typing import Any

import transformers
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ddp_trainer.integrations import distributed, require
from ddp_trainer.sync.health import SyncHealth, config_of

MIN_VERSION = (4, 57)
require("transformers", transformers.__version__, MIN_VERSION, "ddp_trainer.integrations.transformers")


class SyncHealthCallback(TrainerCallback):  # type: ignore[misc]
    """Checks that every rank holds the same model while a ``transformers.Trainer`` trains."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.health: SyncHealth | None = None
        self.loss: float | None = None
        self.samples = 0

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: Any = None,
        optimizer: Any = None,
        **kwargs: Any,
    ) -> None:
        if not distributed():
            return
        if model is None:
            raise ValueError("SyncHealthCallback: the Trainer passed no model to on_train_begin")
        optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper holds the real one
        broadcast = args.ddp_broadcast_buffers if args.ddp_broadcast_buffers is not None else True
        self.samples = args.per_device_train_batch_size * args.gradient_accumulation_steps
        options = {
            "total_steps": state.max_steps if state.max_steps and state.max_steps > 0 else None,
            "broadcast_buffers": broadcast,
            "start_step": state.global_step,
            **self.options,
        }
        config, others = config_of(options)
        self.health = SyncHealth(model, optimizer, config, **others)
        self.health.close_on_uncaught_exception()

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        if logs and isinstance(logs.get("loss"), int | float):
            self.loss = float(logs["loss"])

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.health is not None:
            self.health.step(self.loss, self.samples)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.health is not None:
            self.health.close()
