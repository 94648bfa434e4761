"""A fresh worker's side of a heal (issue 57): the meeting the survivors of a heal hold in the new world
(:meth:`ddp_trainer.sync.heal.Healer.heal`), held by a worker that starts fresh in it (the joiner of a grow,
the new worker of a node whose own worker crashed, a node that woke after it was judged silent). Where
survivors are there, its state comes from a live replica over the process group, not from storage; where
every worker is fresh, it restores as before heals. The built-in trainer calls :func:`join` before its
restore and :func:`joined` once its ``SyncHealth`` is built: between the two it runs the collectives the
survivors run in their heal (DDP's wrap, ``SyncHealth``'s start)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from ddp_trainer.core import reform
from ddp_trainer.sync.heal import HealFailed, begin_world, take_extra
from ddp_trainer.sync.health import SyncHealth, say_world

log = logging.getLogger("ddp_trainer")


@dataclass(frozen=True)
class Joined:
    """A fresh worker's place in a world whose survivors heal into it (:func:`join`)."""

    plan: reform.Plan
    bytes: int
    """Bytes of state the source sent (every rank counts the same tensors)."""
    started: float
    """``time.perf_counter()`` when the worker began to meet."""


def join(subject: Any) -> Joined | None:
    """Collective, a fresh worker's first in a world of workers that heal (``DDPJOB_HEAL``), before it
    restores anything: the survivors' meeting (the module's docstring), with ``subject`` (a train state:
    ``model``, not yet wrapped in DDP, ``optimizer``, ``scaler``, ``step``, ``epoch``) as this rank's
    arrival. None when no rank survived (every worker starts fresh: the caller restores from the
    checkpoint, as before heals). Otherwise the state came from the plan's source, a live replica, over the
    process group: the caller then wraps the model in DDP, builds its ``SyncHealth`` with a check that only
    reports, and calls :func:`joined`, as the survivors do. :class:`HealFailed` when the plan refuses
    (layouts differ, survivors too far apart: every rank computes the same plan, the survivors fail too)."""
    started = time.perf_counter()
    module = subject.model
    arrivals: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(arrivals, reform.Arrival(reform.FRESH, 0, reform.layout_digest(module)))
    plan = reform.resume_plan(arrivals)
    if plan.refused:
        raise HealFailed(plan.refused)
    if plan.step is None:
        return None
    assert plan.src is not None
    copied = reform.copy_state_(module, subject.optimizer, src=plan.src)
    take_extra(subject, copied.extra)
    log.warning(  # every joiner says it (its rank's lines below WARNING are not printed)
        "joined a world that heals in place: state of step %d from rank %d over the process group "
        "(%d bytes), not from storage",
        plan.step,
        plan.src,
        copied.bytes,
    )
    return Joined(plan, copied.bytes, started)


def joined(done: Joined, health: SyncHealth, fence: Callable[[int], int] | None) -> int:
    """A joiner's end of the heal, once its ``health`` was built (its initial check with a policy that only
    reports, as the survivors' ``SyncHealth.rejoin``): refused (:class:`HealFailed`) when that check found
    the replicas differ; else the world begun (:func:`begin_world`), said by rank 0 as a healed world, and
    its checkpoint number returned."""
    plan, rank = done.plan, dist.get_rank()
    assert plan.step is not None
    if health.tally.checks and not health.tally.last_check_ok:
        raise HealFailed(f"the healed world's replica check failed at step {plan.step}")
    health.metrics.healed(plan.lost, done.bytes)
    number = begin_world(fence, plan.step, rank)
    if rank == 0:
        say_world(
            dist.get_world_size(),
            plan.step,
            healed=(plan.lost, done.bytes, time.perf_counter() - done.started),
        )
    return number
