"""What happens at a step boundary, besides metrics: the fire drill, the stop agreement, the step-time
skew, and the decision whether a check (and a checkpoint) is due, and which (:data:`CheckKind`).

:func:`check_due` (the one rule for when a check is due, also :class:`ddp_trainer.sync.SyncHealth`'s)
and :func:`due_at` are pure. :func:`agree_stop` and :meth:`SkewMeter.publish` are collectives: every rank
calls them at the same boundaries (the runner's ``on_step``), in the same order.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from types import FrameType
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn

from ddp_trainer.core.config import ChaosSpec, TrainerConfig
from ddp_trainer.core.lossread import LateRead
from ddp_trainer.sync import replicas

log = logging.getLogger("ddp_trainer")

CheckKind = Literal["initial", "periodic", "final", "repair"]
"""Why a check runs (the ``kind`` label of ``ddp_sync_checks_total``): before step 1, every
``--sync-every`` steps or before a checkpoint, at the end or when stopping, after a repair."""

CHAOS_NUDGE = 1e-3
"""How far the fire drill moves one parameter element."""


@dataclass(frozen=True)
class Due:
    """What the boundary after a step must do."""

    check: CheckKind | None
    """The check to run (``periodic`` or ``final``), or None."""
    save: bool
    """Save a checkpoint if that check passes."""


def check_due(
    step: int, every: int, total: int | None, *, stop: bool = False, save: bool = False, probe: bool = False
) -> CheckKind | None:
    """The one rule for when a check is due after ``step`` (the built-in trainer's and
    :meth:`ddp_trainer.sync.SyncHealth.step`'s): ``final`` at or past ``total`` (None: unknown) and when
    the ranks ``stop``; else ``periodic`` every ``every`` steps, before a checkpoint is saved (``save``)
    and before a compute probe (``probe``: it needs just-verified parameters); else None."""
    if stop or (total is not None and step >= total):
        return "final"
    if save or probe or step % every == 0:
        return "periodic"
    return None


def due_at(step: int, config: TrainerConfig, *, saving: bool, stop: bool, probe: bool = False) -> Due:
    """After ``step`` of the built-in trainer: the check :func:`check_due` says (every ``--sync-every``
    steps, at ``--steps``, when stopping, before every checkpoint and before a ``probe``); save every
    ``--checkpoint-every`` steps (0: never) and when stopping, if ``saving``."""
    every = config.checkpoint_every
    save = saving and ((every > 0 and step % every == 0) or stop)
    return Due(check_due(step, config.sync_every, config.steps, stop=stop, save=save, probe=probe), save)


def drill_fires(chaos: ChaosSpec | None, rank: int, step: int) -> bool:
    """Whether ``DDPJOB_CHAOS_DIVERGE`` names this rank and this step."""
    return chaos is not None and chaos.rank == rank and chaos.step == step


def nudge(model: nn.Module, amount: float = CHAOS_NUDGE) -> str:
    """The fire drill: move the first element of the first parameter by ``amount``; returns its name."""
    name, param = replicas.named_tensors(model, buffers=False)[0]
    with torch.no_grad():
        replicas.local(param).view(-1)[0] += amount  # a DTensor (HSDP): this rank's shard
    return name


GROW, STOP = 1, 2
"""The step boundary's agreement is one flag reduced with MAX: a stop (SIGTERM or SIGINT on any rank)
outranks a grow (a node waits to join: the ranks leave their group together at that boundary and heal,
:mod:`ddp_trainer.sync.heal`)."""


def flag_of(stop: bool, grow: bool) -> int:
    """This rank's flag for the agreement: :data:`STOP`, :data:`GROW` or 0."""
    return STOP if stop else GROW if grow else 0


def agree_stop(requested: bool, grow: bool = False) -> int:
    """Collective (one 4-byte all_reduce): stop if any rank was asked to, so all stop at the same step; else
    grow if any rank's launcher asked for it. The reduced flag (:data:`STOP`, :data:`GROW`, 0). Reading
    it waits for the device: on CUDA use :class:`StopAgreement`, which does not."""
    flag = torch.tensor([flag_of(requested, grow)], dtype=torch.int32, device=replicas.comm_device(None))
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())


class StopAgreement:
    """:func:`agree_stop` at every step boundary without making the host wait for the GPU. On CUDA (NCCL) each
    step's all_reduce is queued behind the step's kernels and its result read a step later
    (:class:`ddp_trainer.core.lossread.LateRead`): the call returns the *previous* step's agreement. Every
    rank reads the same reduced flag at the same step, so all stop together, one step after the request.
    Elsewhere it is :func:`agree_stop` itself."""

    def __init__(self) -> None:
        self._late = LateRead()

    def __call__(self, requested: bool) -> bool:
        """Whether the ranks stop (:meth:`agree`, no grow asked)."""
        return self.agree(requested)[0]

    def agree(self, requested: bool, grow: bool = False) -> tuple[bool, bool]:
        """Whether the ranks stop, and (when they do not) whether they grow, at this boundary."""
        device = replicas.comm_device(None)
        if device.type != "cuda":
            flag = agree_stop(requested, grow)
        else:
            mine = flag_of(requested, grow)
            reduced = torch.full((1,), mine, dtype=torch.int32, device=device)  # a fill, not a copy
            dist.all_reduce(reduced, op=dist.ReduceOp.MAX)
            flag = int(self._late.put(reduced) or 0)
        return flag >= STOP, flag == GROW


class StopRequest:
    """Set by SIGTERM/SIGINT; the ranks then stop together at the next step boundary."""

    def __init__(self) -> None:
        self.requested = False

    def install(self) -> None:
        """Make SIGTERM and SIGINT set the flag (and nothing else)."""

        def handler(signum: int, frame: FrameType | None) -> None:
            self.requested = True
            log.warning("received %s: stopping at the next step boundary", signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


def skew_ratio(slowest: float, fastest: float) -> float:
    """``(slowest - fastest) / slowest`` of the ranks' mean step times, 0-1 (0 when nothing was timed)."""
    return (slowest - fastest) / slowest if slowest > 0 else 0.0


class SkewMeter:
    """This rank's step times since the last publish (their sum and count)."""

    def __init__(self) -> None:
        self.total, self.count = 0.0, 0

    def add(self, seconds: float) -> None:
        """One step's wall time."""
        self.total += seconds
        self.count += 1

    def publish(self) -> float | None:
        """Collective (one all_reduce) unless no step was timed on this rank since the last call, which
        happens on every rank alike: the skew between the ranks' mean step times since then."""
        if not self.count:
            return None
        mean = self.total / self.count
        self.total, self.count = 0.0, 0
        both = torch.tensor([mean, -mean], dtype=torch.float64, device=replicas.comm_device(None))
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        return skew_ratio(float(both[0]), -float(both[1]))
