"""The sync check, its tally and its policy: what :class:`~ddp_trainer.sync.health.SyncHealth` runs at a
check, and what it counts.

- First the ranks agree on what they compare (:meth:`Checking.agree`: a header of their step, their number
  of tensors and a hash of the tensors' names, shapes and dtypes, all-reduced on a gloo group of its own
  with a short timeout); then the fingerprints (:func:`check_state`: parameters, buffers, optimizer and
  control state, combined across an HSDP model's shards).
- :class:`Verifier` counts each check in the :class:`Tally`, records it in the metrics and applies the
  ``--on-divergence`` policy: ``Fail`` raises :class:`DivergenceError` (reason ``SyncDivergence``);
  ``Repair`` re-broadcasts from rank 0 (:func:`broadcast_state`), checks again and counts the repair (a
  repair that does not take raises, reason ``RepairFailed``); ``Warn`` counts the divergence and goes on.
  The collective check and the repair broadcast are injected (``SyncHealth`` gives its own,
  :meth:`Checking._check` and :meth:`Checking._repair`; by default :func:`check_state` and
  :func:`broadcast_state`), so the policy and the tally can be tested with made-up reports and no process
  group.

``SyncHealth`` is a :class:`Checking`, whose attributes it sets when it is built
(:mod:`ddp_trainer.sync.health`); :class:`Tracked` is what a loop that ``SyncHealth`` does not own is
checked as. Long because the check, its tally and its policy are one concept: in two modules, the policy
called back the check of the module that had called it, and a reader went back and forth between them.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from ddp_trainer.core.config import Policy
from ddp_trainer.sync import boundary, fingerprints, replicas, sharded
from ddp_trainer.sync.boundary import CheckKind
from ddp_trainer.sync.settings import SyncHealthError

if TYPE_CHECKING:  # no runtime import: prometheus_client must not load before PROMETHEUS_MULTIPROC_DIR is set
    from ddp_trainer.reporting.metrics import TrainerMetrics

log = logging.getLogger("ddp_trainer")


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


@dataclass
class Tracked:
    """The :class:`Subject` of a loop that :class:`SyncHealth` does not own."""

    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    scaler: torch.amp.GradScaler | None
    step: int = 0
    epoch: int | None = None


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
    None: as the DDP wrapper says, no copy for a plain module); ``buffers=False`` leaves them out. The
    process's wait for gloo at exit is its caller's (``SyncHealth`` has it when built:
    :func:`ddp_trainer.sync.replicas.compare_replicas`)."""
    if broadcast_buffers is None:
        broadcast_buffers = bool(getattr(state.model, "broadcast_buffers", False))
    if broadcast_buffers:
        replicas.broadcast_buffers_(
            state.model, group=group
        )  # what DDP does at the next forward, one step early
    return replicas.compare_replicas(state.model, group, buffers=buffers, extra=control_state(state))


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


def header(step: int, named: list[tuple[str, torch.Tensor]]) -> torch.Tensor:
    """What ranks must agree on before comparing fingerprints: the step, the number of tensors, and a
    hash of their names, shapes and dtypes; each with its negation, so one MAX all-reduce gives both the
    largest and the smallest value."""
    structure = int(replicas.structure_fingerprint(named).item())
    values = [step, len(named), structure]
    return torch.tensor([v for x in values for v in (x, -x)], dtype=torch.int64)


def disagreement(reduced: list[int], mine: list[int], rank: int) -> str | None:
    """Why the ranks cannot compare fingerprints (from the reduced header and this rank's), or None."""
    names = ("step", "number of tensors", "tensor names, shapes and dtypes")
    for i, what in enumerate(names):
        high, low = reduced[2 * i], -reduced[2 * i + 1]
        if high != low:
            if i == 0:
                return (
                    f"the ranks are at different steps (from {low} to {high}; rank {rank} is at {mine[0]}): "
                    "they took different numbers of optimizer steps, or called SyncHealth.step() a "
                    "different number of times"
                )
            if i == 1:
                return (
                    f"the ranks hold models with different numbers of tensors (from {low} to {high}; rank "
                    f"{rank} has {mine[1]}): build SyncHealth from the same model on every rank"
                )
            return (
                f"the ranks hold models whose {what} differ: build SyncHealth from the same model everywhere"
            )
    return None


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


class Checking:
    """The checks of one model: the header agreement, the fingerprint comparison and the repair, on the
    attributes :class:`~ddp_trainer.sync.health.SyncHealth` sets when it is built."""

    subject: Any
    verifier: Verifier
    metrics: TrainerMetrics
    layout: sharded.Layout | None
    group: dist.ProcessGroup | None
    compared: dist.ProcessGroup | None
    peers: dist.ProcessGroup | None
    rank: int
    peer_timeout: float
    broadcast_buffers: bool | None
    check_buffers: bool
    skew: boundary.SkewMeter
    world_checks_from: int = 0
    """The tally's checks when this world began (set by ``SyncHealth`` at each world's start): the world's
    first check is the one after them."""

    @property
    def checks(self) -> int:
        """Checks done so far (the tally)."""
        return self.tally.checks

    @property
    def tally(self) -> Tally:
        """The sync bookkeeping the report states."""
        return self.verifier.tally

    @property
    def current_step(self) -> int:
        """Optimizer steps done (counting from the state's step when one was given)."""
        return int(self.subject.step)

    def check(self, kind: CheckKind) -> replicas.SyncReport:
        """One check now (collective), with the step-time skew since the previous one; applies the policy
        (raises :class:`DivergenceError` under ``Fail`` or when a repair does not take). Then the
        fingerprint kernel in use goes into ``ddp_info``: a compiled kernel that failed during the check has
        fallen back (:mod:`ddp_trainer.sync.fingerprints.dispatch`)."""
        try:
            return self.verifier.verify(self.subject, kind)
        finally:
            first = next(self.subject.model.parameters(), None)
            device = first.device if first is not None else torch.device("cpu")
            self.metrics.describe(fingerprint=fingerprints.impl_for(device))

    def agree(self, kind: str) -> None:
        """Collective on the header's group: every rank at the same step with the same tensors, or a
        :class:`SyncHealthError` naming the cause (also when the peers do not come within the timeout)."""
        named = replicas.named_tensors(self.subject.model)
        mine = header(self.current_step, named)
        reduced = mine.clone()
        # A world's first check may wait for slow starters (the job's own timeout), on the default group:
        # a healed world's too, where a fresh joiner's first is its very first; later ones need no such wait.
        first = self.tally.checks == self.world_checks_from
        group = self.group if first else self.peers
        device = replicas.comm_device(group) if first else torch.device("cpu")
        reduced = reduced.to(device)
        started = time.monotonic()
        try:
            dist.all_reduce(reduced, op=dist.ReduceOp.MAX, group=group)
        except RuntimeError as err:
            waited = time.monotonic() - started
            raise SyncHealthError(
                f"the {kind} at step {self.current_step} on rank {self.rank} was not joined by "
                f"the other ranks within {waited:.0f} s (timeout {self.peer_timeout:g} s): they ended, or "
                f"took a different number of steps ({type(err).__name__}: {str(err).splitlines()[0][:200]})"
            ) from None
        why = disagreement(reduced.cpu().tolist(), mine.tolist()[::2], self.rank)
        if why is not None:
            raise SyncHealthError(f"the {kind} at step {self.current_step} cannot run: {why}")

    def _check(self, subject: Any) -> replicas.SyncReport:
        self.agree("sync check")  # first: the skew and the fingerprint need every rank
        skew = self.skew.publish()
        if skew is not None:
            self.metrics.skew.set(skew)
        report = check_state(
            subject, self.compared, broadcast_buffers=self.broadcast_buffers, buffers=self.check_buffers
        )
        if self.layout is None:
            return report
        return sharded.combine(report, self.layout, self.peers if self.peers is not None else self.group)

    def _repair(self, subject: Any) -> None:
        broadcast_state(subject, self.compared)
