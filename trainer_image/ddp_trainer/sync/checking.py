"""The check that :class:`~ddp_trainer.sync.health.SyncHealth` runs: first the ranks agree on what they
compare (a header of their step, their number of tensors and a hash of the tensors' names, shapes and
dtypes, all-reduced on a gloo group of its own with a short timeout), then the fingerprints
(:func:`~ddp_trainer.sync.verify.check_state`, combined across an HSDP model's shards), and the repair the
policy may ask for; :class:`Tracked` is what a loop that ``SyncHealth`` does not own is checked as.
``SyncHealth`` is a :class:`Checking`, whose attributes it sets when it is built
(:mod:`ddp_trainer.sync.health`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from ddp_trainer.sync import boundary, fingerprints, replicas, sharded
from ddp_trainer.sync.settings import SyncHealthError
from ddp_trainer.sync.verify import CheckKind, Tally, Verifier, broadcast_state, check_state

if TYPE_CHECKING:  # prometheus_client loads only after PROMETHEUS_MULTIPROC_DIR is set
    from ddp_trainer.reporting.metrics import TrainerMetrics


@dataclass
class Tracked:
    """The :class:`ddp_trainer.sync.verify.Subject` of a loop that :class:`SyncHealth` does not own."""

    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    scaler: torch.amp.GradScaler | None
    step: int = 0
    epoch: int | None = None


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
        # The first check may wait for slow starters (the job's own timeout); later ones need no such wait.
        first = self.tally.checks == 0
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
