"""Prove that every rank holds the same model: bit-exact, cheap, on the device.

This module is the public library; use it from your own training code.

* :class:`SyncHealth` — everything the ddpjob trainer does at a check, for any DDP loop: build it from the
  model (and optimizer), call ``step()`` after each optimizer step; it checks every ``every`` steps,
  applies the policy (Fail, Repair, Warn), serves the ``ddp_*`` metrics and writes the report the operator
  reads (``docs/your-code.md``). Its settings are one :class:`SyncConfig` (``SyncHealth.Config``), with
  ``SyncConfig.from_env()``: ``SyncHealth(model, optimizer, SyncConfig.from_env(every=50))``; the settings as
  keywords of ``SyncHealth`` itself still work, deprecated (a ``DeprecationWarning`` names the config).
* :class:`HealingSyncHealth` — the same for a loop that heals in place in an elastic job: it wraps the model
  in DDP and runs each step through one call, ``train_step(fn)``, which answers "go on" or "the world
  changed" (:mod:`ddp_trainer.sync.healing`).
* :func:`fingerprint` — one int64 per tensor, a pure function of the tensor's raw bits;
  :func:`structure_fingerprint` — one int64 for the tensors' names, shapes and dtypes.
* :func:`check_in_sync` — do all ranks hold the same tensors? Two tiny collectives in the common case.
* :func:`broadcast_module_` — make every rank hold ``src``'s tensors (after changing one rank on purpose,
  or to repair a divergence).
* :func:`average_module_` — make every rank hold the mean of all ranks' tensors (after independent
  per-rank changes, e.g. local fine-tuning steps).

The functions are documented where they live, :mod:`ddp_trainer.sync.replicas` (why not
``broadcast_object_list``, buffers under DDP); :class:`SyncHealth` in :mod:`ddp_trainer.sync.health`.
"""

from __future__ import annotations

from ddp_trainer.sync.healing import HealingSyncHealth, World
from ddp_trainer.sync.health import SyncHealth
from ddp_trainer.sync.replicas import (
    SyncReport,
    TensorMismatch,
    average_module_,
    broadcast_buffers_,
    broadcast_module_,
    broadcast_tensors_,
    check_in_sync,
    comm_device,
    fingerprint,
    fingerprint_tensors,
    named_tensors,
    optimizer_state_tensors,
    structure_fingerprint,
)
from ddp_trainer.sync.settings import SyncConfig, SyncHealthError

__all__ = [
    "HealingSyncHealth",
    "SyncConfig",
    "SyncHealth",
    "SyncHealthError",
    "SyncReport",
    "TensorMismatch",
    "World",
    "average_module_",
    "broadcast_buffers_",
    "broadcast_module_",
    "broadcast_tensors_",
    "check_in_sync",
    "comm_device",
    "fingerprint",
    "fingerprint_tensors",
    "named_tensors",
    "optimizer_state_tensors",
    "structure_fingerprint",
]
