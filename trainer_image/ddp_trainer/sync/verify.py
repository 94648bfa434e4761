"""Verification of the train state: one sync check, its tally, and the ``--on-divergence`` policy.

:meth:`Verifier.verify` runs a check, counts it in the :class:`Tally`, records it in the metrics and
applies the policy: ``Fail`` raises :class:`DivergenceError` (reason ``SyncDivergence``); ``Repair``
re-broadcasts from rank 0, checks again and counts the repair (a repair that does not take raises, reason
``RepairFailed``); ``Warn`` counts the divergence and goes on. The collective check and the repair
broadcast are injected (by default :func:`check_state` and :func:`broadcast_state`), so the policy and
the tally can be tested with made-up reports and no process group.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch
import torch.distributed as dist
from torch import nn

from ddp_trainer.core.config import Policy
from ddp_trainer.sync import replicas

if TYPE_CHECKING:  # no runtime import: prometheus_client must not load before PROMETHEUS_MULTIPROC_DIR is set
    from ddp_trainer.reporting.metrics import TrainerMetrics

log = logging.getLogger("ddp_trainer")

CheckKind = Literal["initial", "periodic", "final", "repair"]
"""Why a check runs (the ``kind`` label of ``ddp_sync_checks_total``): before step 1, every
``--sync-every`` steps or before a checkpoint, at the end or when stopping, after a repair."""


class Subject(Protocol):
    """What a check reads: the model and the control state beside it
    (:class:`ddp_trainer.core.state.TrainState` is one; :class:`ddp_trainer.sync.health.SyncHealth` keeps one
    for a loop it does not own)."""

    @property
    def model(self) -> nn.Module: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer | None: ...
    @property
    def scaler(self) -> torch.amp.GradScaler | None: ...
    @property
    def step(self) -> int: ...
    @property
    def epoch(self) -> int | None: ...


CheckFn = Callable[[Subject], replicas.SyncReport]
RepairFn = Callable[[Subject], None]


class DivergenceError(Exception):
    """The ranks hold different models and the policy says stop."""

    def __init__(self, report: replicas.SyncReport, reason: str) -> None:
        ranks = ", ".join(str(rank) for rank in list(report.ranks)[:8]) or "unknown"
        where = "".join(f"; {line}" for line in report.where[:4])
        super().__init__(
            f"{len(report.mismatches)} tensor(s) differ between ranks: {', '.join(report.mismatched[:5])}; "
            f"diverged rank(s): {ranks}{where}"
        )
        self.report = report
        self.reason = reason
        """``SyncDivergence`` (policy ``Fail``) or ``RepairFailed`` (a ``Repair`` that did not take)."""


@dataclass
class Tally:
    """Sync bookkeeping for the report; identical on every rank (every rank sees every check)."""

    checks: int = 0
    mismatches: int = 0
    repairs: int = 0
    last_check_step: int = -1
    last_check_ok: bool = False
    mismatched_tensors: list[str] = field(default_factory=list)
    diverged_ranks: list[int] = field(default_factory=list)
    max_abs_diff: float = 0.0

    @property
    def verified(self) -> bool:
        """Every divergence found was repaired and the last check passed."""
        return self.checks > 0 and self.mismatches == self.repairs and self.last_check_ok


def control_state(state: Subject) -> dict[str, Any]:
    """What a check compares beside parameters and buffers: step, epoch (where known), loss scale (1.0
    without an enabled scaler), learning rates and the optimizer's state tensors (where there is one)."""
    scaler = state.scaler
    extras: dict[str, Any] = {"control.step": state.step}
    if state.epoch is not None:
        extras["control.epoch"] = state.epoch
    extras["control.loss_scale"] = (
        float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0
    )
    if state.optimizer is not None:
        for i, group in enumerate(state.optimizer.param_groups):
            extras[f"control.lr.{i}"] = float(group["lr"])
        extras.update(replicas.optimizer_state_tensors(state.optimizer, state.model))
    return extras


def check_state(
    state: Subject, group: Any = None, *, broadcast_buffers: bool | None = None, buffers: bool = True
) -> replicas.SyncReport:
    """Collective: one check of parameters, buffers, optimizer and control state on every rank of
    ``group``. Buffers are first copied from rank 0 when DDP does so at each forward (``broadcast_buffers``;
    None: as the DDP wrapper says, no copy for a plain module); ``buffers=False`` leaves them out."""
    if broadcast_buffers is None:
        broadcast_buffers = bool(getattr(state.model, "broadcast_buffers", False))
    if broadcast_buffers:
        replicas.broadcast_buffers_(
            state.model, group=group
        )  # what DDP does at the next forward, one step early
    return replicas.check_in_sync(state.model, group, buffers=buffers, extra=control_state(state))


def model_digest(model: nn.Module) -> str:
    """A digest of this rank's fingerprint of ``model``: equal digests mean bit-identical models."""
    return hashlib.sha256(str(replicas.fingerprint(model).tolist()).encode()).hexdigest()[:16]


def broadcast_state(state: Subject, group: Any = None) -> None:
    """Collective: every rank takes the model and optimizer state of ``group``'s first rank (rank 0 of
    the world; of a replica group, for HSDP)."""
    src = 0 if group is None else dist.get_global_rank(group, 0)
    replicas.broadcast_module_(state.model, src=src, group=group)
    if state.optimizer is not None:
        tensors = replicas.optimizer_state_tensors(state.optimizer, state.model).values()
        replicas.broadcast_tensors_(tensors, src=src, group=group)


class Verifier:
    """Checks the train state, keeps the :class:`Tally` and applies ``policy`` to a divergence."""

    def __init__(
        self,
        policy: Policy,
        metrics: TrainerMetrics | None = None,
        *,
        check: CheckFn = check_state,
        repair: RepairFn = broadcast_state,
    ) -> None:
        self.policy = policy
        self.metrics = metrics
        self.check = check
        self.repair = repair
        self.tally = Tally()

    def verify(self, state: Subject, kind: CheckKind) -> replicas.SyncReport:
        """Check, count, observe; on a divergence apply the policy (which may raise or repair)."""
        started = time.perf_counter()
        report = self.check(state)
        duration = time.perf_counter() - started
        tally = self.tally
        tally.checks += 1
        tally.last_check_step = state.step
        tally.last_check_ok = report.in_sync
        if self.metrics is not None:
            self.metrics.observe_check(
                kind,
                state.step,
                report.in_sync,
                duration,
                len(report.mismatches),
                report.max_abs_diff,
                time.time(),
                report.ranks,
            )
        if report.in_sync:
            log.info(
                "step %d: %s check passed (%d tensors, %.1f ms)",
                state.step,
                kind,
                report.checked,
                duration * 1e3,
            )
            return report
        tally.mismatches += 1
        tally.mismatched_tensors = list(report.mismatched)
        tally.diverged_ranks = list(report.ranks)
        tally.max_abs_diff = report.max_abs_diff
        log.error(
            "step %d: %s check FAILED: %d tensor(s) differ (%s), ranks %s, max |diff| %g",
            state.step,
            kind,
            len(report.mismatches),
            ", ".join(report.mismatched[:8]),
            list(report.ranks),
            report.max_abs_diff,
        )
        for line in report.where:
            log.error("step %d: %s", state.step, line)
        if kind == "repair":
            raise DivergenceError(report, "RepairFailed")
        if self.policy == "Fail":
            raise DivergenceError(report, "SyncDivergence")
        if self.policy == "Warn":
            return report
        return self._repair(state)

    def _repair(self, state: Subject) -> replicas.SyncReport:
        """Re-broadcast from rank 0, then verify again (raises if the repair did not take)."""
        self.repair(state)
        report = self.verify(state, "repair")
        self.tally.repairs += 1
        if self.metrics is not None:
            self.metrics.repairs.inc()
        log.warning("step %d: divergence repaired from rank 0 (repair %d)", state.step, self.tally.repairs)
        return report
