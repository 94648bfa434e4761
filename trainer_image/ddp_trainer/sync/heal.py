"""A worker's heal without a restart (issue 57, stage 1: a lost peer, or a silent one, whose connections the
worker shuts down at its launcher's request: :meth:`Healer.sever`). A collective that raises because a peer
is gone (:func:`ddp_trainer.core.reform.is_peer_loss`) no longer ends the worker when its launcher can heal:
the worker drops the step in flight, marks itself heal-wanted (:data:`ddp_trainer.core.notice.HEAL_WANTED`),
and waits, bounded, for the launcher's notice of a newer world (:mod:`ddp_trainer.core.notice`: torch's
rank assignment of the next rendezvous, which the launcher ran without stopping its workers). Then, in the
same process, with the same module and optimizer:

1. re-form the default group at the notice's rank and size, on the store the new rank 0 hosts at the
   notice's address (:func:`~ddp_trainer.core.reform.bootstrap_store`: torch's own ``env://`` store, so
   workers the launcher starts fresh in that world meet the survivors there);
2. meet: the first collective of the new world, every rank's :class:`~ddp_trainer.core.reform.Arrival`
   (survivor or fresh, last step completed, module layout), from which every rank computes the same
   :func:`~ddp_trainer.core.reform.resume_plan`;
3. copy the state (parameters, buffers, optimizer state, with the step, epoch and loss scaler's state) from
   the plan's source to its receivers (fresh ranks, survivors that got further), bit for bit;
4. wrap DDP again around the same module (the old wrapper's reducer belongs to the old group), with the
   old wrapper's options;
5. :meth:`SyncHealth.rejoin <ddp_trainer.sync.health.SyncHealth.rejoin>`: the collectives ``SyncHealth``'s
   constructor runs, the initial replica check among them; a mismatch fails the heal whatever the
   divergence policy says (its fire drill, ``DDPJOB_CHAOS_HEAL_NUDGE``: :meth:`Healer.drill`, just before);
6. rank 0 begins the world's fence (``fence``: :func:`checkpoint_fence`), whose number every rank takes;
7. marks itself healed (the round and what it cost) and rank 0 says the world, as a verified elastic world
   is said, with ``(healed in place: ...)``.

Without a launcher's notice path (no launcher, plain torchrun) nothing here is armed: the error is the
caller's to raise, as before heals. No checkpoint is read.

Long because the heal's steps run in one sequence of collectives that every rank of the new world must
run in the same order: split across modules, one rank's order could drift from another's.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_trainer import contract
from ddp_trainer.checkpoint import checkpoints
from ddp_trainer.checkpoint.provenance import Writer
from ddp_trainer.checkpoint.stores import Store as CheckpointStore
from ddp_trainer.core import inplace, notice, reform
from ddp_trainer.core.config import read_pod_env
from ddp_trainer.core.notice import Notice
from ddp_trainer.sync import boundary
from ddp_trainer.sync.health import SyncHealth, say_world

if TYPE_CHECKING:  # prometheus_client loads only after PROMETHEUS_MULTIPROC_DIR is set
    from ddp_trainer.reporting.metrics import TrainerMetrics

log = logging.getLogger("ddp_trainer")

HEAL_WAIT_SECONDS = 60.0
"""How long a worker that marked itself heal-wanted waits for its launcher's notice before it gives up (and
its error ends it, as before heals)."""
POLL_SECONDS = 0.1


HEAL_ENV = "DDPJOB_HEAL"
"""Set to ``1`` by a launcher that heals (:mod:`ddp_trainer.launch.heal_round`) for its workers."""


def armed_here(env: Mapping[str, str]) -> bool:
    """Whether this worker heals: its launcher said so, and its default group is gloo's (an NCCL group's
    heal needs its abort from a watch thread: a later stage)."""
    return env.get(HEAL_ENV, "") == "1" and dist.is_initialized() and dist.get_backend() == "gloo"


class WorldGrows(Exception):
    """Raised at a step boundary where the ranks agreed to grow (a node waits to join; the launcher's
    request, :func:`ddp_trainer.core.notice.request_grow`): they leave their group together, the step done
    and nothing in flight, and heal into the larger world (no step lost)."""

    def __init__(self, step: int) -> None:
        super().__init__(f"a node waits to join: the ranks leave their group together after step {step}")
        self.step = step


class HealFailed(RuntimeError):
    """The heal started and cannot finish: the worker's mark says why; it exits, and its launcher restarts
    it as before heals."""


@dataclass(frozen=True)
class Healed:
    """What a heal did, on this rank."""

    round: int
    rank: int
    world_size: int
    step: int
    """The step the healed world resumes after: its first step is ``step + 1``."""
    lost: int
    bytes: int
    """Bytes of state sent by the source (0 when no rank needed the state)."""
    seconds: float
    """From the failure caught to the healed world verified."""
    src: int | None
    received: bool
    checkpoint_world: int = 0
    """The number the healed world stamps on its checkpoints (its fence's), 0 without a fence."""


def checkpoint_fence(store: CheckpointStore, writer: Writer) -> Callable[[int], int]:
    """Rank 0's fence for a healed world starting from a step: :func:`checkpoints.begin_world`."""
    return lambda step: checkpoints.begin_world(
        store, writer, step, checkpoints.read_fences(store, writer.identity)
    )


def _wrap(module: nn.Module, old: nn.Module) -> DistributedDataParallel:
    """``module`` in a new DDP wrapper with the options of the ``old`` one (none when it was no wrapper). A
    wrapper without forward buffer sync is made again with ``broadcast_buffers=False``, deprecated in torch
    2.15 (a ``FutureWarning``, muted here) but the one switch that also skips the buffers' sync at start,
    which rank-local buffers need."""
    if not isinstance(old, DistributedDataParallel):
        return DistributedDataParallel(module)
    options: dict[str, Any] = {
        "device_ids": old.device_ids,
        "find_unused_parameters": old.find_unused_parameters,
        "gradient_as_bucket_view": old.gradient_as_bucket_view,
    }
    if not getattr(old, "forward_sync_buffers", True):
        options["broadcast_buffers"] = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return DistributedDataParallel(module, **options)


class Healer:
    """One worker's heals: where its launcher's notice lies, the newest round it has healed into."""

    def __init__(
        self,
        env: MutableMapping[str, str] | None = None,
        *,
        wait_seconds: float = HEAL_WAIT_SECONDS,
        timeout: timedelta = timedelta(seconds=60),
    ) -> None:
        self.env: MutableMapping[str, str] = os.environ if env is None else env
        self.path = notice.notice_path(self.env)
        self.mark = inplace.worker_mark(self.env, os.getpid())
        self.wait_seconds, self.timeout = wait_seconds, timeout
        known = notice.read_notice(self.path)
        self.round = known.round if known is not None else -1
        """The round of the newest notice this worker's world is past (one there before it started is)."""
        self.local_rank = int(self.env.get("LOCAL_RANK", "0") or 0)
        pod = read_pod_env(self.env)
        first_run = pod.attempt == contract.FIRST_ATTEMPT and not inplace.read_state(self.env).restarts
        self.nudge = pod.heal_nudge if first_run else None
        """The heal's fire drill (``DDPJOB_CHAOS_HEAL_NUDGE``): the rank of the healed world that nudges
        its parameters, in the first run of attempt 1 only (as the recovery drill), until it did
        (:meth:`drill`)."""
        self.healing = False
        """Between leaving the old group and the healed world's end: a sever request then is not acted on
        (the old group's connections are shut already; the new one's must stay)."""
        self.severs = (
            None if self.path is None else notice.SeverWatch(self.path, self.sever, lambda: self.round)
        )
        """The watch for the launcher's sever request (a member of the world went silent)."""

    def grow_requested(self) -> bool:
        """Whether this worker's launcher asks its world to grow at the next step boundary (the watch's last
        read: no file read per step)."""
        return self.severs is not None and self.severs.grow_requested()

    def sever(self) -> None:
        """Shut this worker's connections down (the launcher's request: a member of its world went silent, or
        its step did not end in time for a grow), so that its collective with the silent member fails as
        after a peer's loss, and it heals. Not while it heals already."""
        if self.healing:
            return
        severed = reform.sever_connections()
        log.warning(
            "a member of this world went silent (its launcher says): %d connection(s) of this worker shut "
            "down, so that its collective with it ends and it heals",
            severed,
        )

    def wanted(self, error: BaseException) -> bool:
        """Whether ``error`` is one to heal from, under a launcher that writes notices: a peer's loss, or the
        ranks' agreement to grow."""
        return self.path is not None and (isinstance(error, WorldGrows) or reform.is_peer_loss(error))

    def await_notice(self, stopped: Callable[[], bool] | None = None) -> Notice | None:
        """Mark heal-wanted and wait up to ``wait_seconds`` for a notice newer than this worker's world; None
        at the deadline, or once ``stopped()`` (its launcher stops it: SIGTERM)."""
        inplace.mark_worker(self.mark, notice.HEAL_WANTED)
        deadline = time.monotonic() + self.wait_seconds
        while True:
            found = notice.read_notice(self.path)
            if found is not None and found.round > self.round:
                return found
            if time.monotonic() >= deadline or (stopped is not None and stopped()):
                return None
            time.sleep(POLL_SECONDS)

    def drill(self, model: nn.Module, rank: int, shrank: bool) -> None:
        """The heal's fire drill: in a heal after a loss (``shrank``: the world is smaller; not a grow's,
        which may come first at the start) where it names ``rank`` (this worker's in the healed world), nudge
        one parameter of ``model``, once (the restart in place the refused heal causes does not repeat it)."""
        if self.nudge is None or self.nudge != rank or not shrank:
            return
        self.nudge = None
        log.warning("fire drill: rank %d nudges its parameters during the heal", rank)
        name = boundary.nudge(model)
        log.warning("fire drill: rank %d nudged %s by %g", rank, name, boundary.CHAOS_NUDGE)

    def fail(self, round_: int, why: str) -> HealFailed:
        """Mark the heal of ``round_`` failed; the error to raise."""
        inplace.mark_worker(self.mark, notice.heal_failed_note(round_, why))
        log.error("heal into round %d failed: %s", round_, why)
        return HealFailed(why)

    def heal(
        self,
        error: BaseException,
        subject: Any,
        *,
        dropped: bool,
        health: SyncHealth | None = None,
        fence: Callable[[int], int] | None = None,
        stopped: Callable[[], bool] | None = None,
        metrics: Callable[[], TrainerMetrics] | None = None,
    ) -> Healed | None:
        """Heal from ``error`` (raised by a collective of ``subject``'s step: a train state with ``model``
        (DDP-wrapped), ``optimizer``, ``scaler``, ``step``, ``epoch``; ``dropped``: the step in flight was
        dropped; ``metrics()``: the rank's series made anew once its new rank is known, for ``health``). None
        when it is not one to heal from or no notice came (``stopped()``: the wait ends early) the caller
        raises ``error`` (the old group is left then).
        Otherwise ``subject.model`` is the new DDP wrapper and ``subject`` holds the healed world's state;
        :class:`HealFailed` when the heal started and cannot finish."""
        if not self.wanted(error):
            return None
        caught = time.perf_counter()
        subject.optimizer.zero_grad(set_to_none=True)  # the step in flight is dropped
        # leave the old group now, with nothing pending (fast), and close its connections: a survivor still
        # blocked on this one fails at once and asks its launcher too, instead of waiting out the timeout
        self.healing = True
        reform.abandon_group()
        reform.sever_connections()
        if isinstance(error, WorldGrows):
            log.warning("%s; waiting up to %.0f s for the launcher's notice", error, self.wait_seconds)
        else:
            log.warning(
                "a peer is gone (%s): step %d in flight dropped, the old group left; waiting up to %.0f s "
                "for the launcher's notice",
                str(error).splitlines()[0][:160] if str(error) else type(error).__name__,
                subject.step + 1,
                self.wait_seconds,
            )
        try:
            found = self.await_notice(stopped)
            if found is None:
                log.error(
                    "no notice of a new world (waited up to %.0f s): this worker ends", self.wait_seconds
                )
                return None
            try:
                return self._into(
                    found, subject, caught, dropped=dropped, health=health, fence=fence, metrics=metrics
                )
            except HealFailed:
                raise
            except Exception as err:  # a store that never came, a collective of the new world
                why = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
                raise self.fail(found.round, why) from err
        finally:
            self.healing = False

    def _into(
        self,
        found: Notice,
        subject: Any,
        caught: float,
        *,
        dropped: bool,
        health: SyncHealth | None,
        fence: Callable[[int], int] | None,
        metrics: Callable[[], TrainerMetrics] | None = None,
    ) -> Healed:
        old = subject.model
        module = old.module if isinstance(old, DistributedDataParallel) else old
        subject.model = module  # the old wrapper goes with the old group
        rank, size = found.rank_of(self.local_rank), found.world_size
        shrank = size < int(self.env.get("WORLD_SIZE", "0") or 0)  # the old world's, until updated below
        self.env.update(found.env(self.local_rank))
        store = reform.bootstrap_store(found.master_addr, found.master_port, rank, size, self.timeout)
        reform.reform(store, reform.World(rank, size, reform.DEFAULT_PREFIX), timeout=self.timeout)
        mine = reform.Arrival(reform.SURVIVOR, int(subject.step), reform.layout_digest(module), dropped)
        arrivals: list[Any] = [None] * size
        dist.all_gather_object(arrivals, mine)  # the meeting: the new world's first collective
        plan = reform.resume_plan(arrivals)
        if plan.refused or plan.step is None:
            raise self.fail(found.round, plan.refused or "no survivor in the new world")
        sent = 0
        if plan.receivers:
            assert plan.src is not None
            scaler = subject.scaler  # None in a user's loop without one
            extra = {"step": subject.step, "epoch": subject.epoch, "scaler": scaler and scaler.state_dict()}
            copied = reform.copy_state_(module, subject.optimizer, src=plan.src, extra=extra)
            if rank in plan.receivers:
                take_extra(subject, copied.extra)
            sent = copied.bytes
        subject.model = _wrap(module, old)  # its constructor broadcasts rank 0's parameters: the drill after
        del old
        self.drill(module, rank, shrank)
        if health is not None:
            verified = health.rejoin(subject.model, metrics() if metrics is not None else None)
            if not verified:
                raise self.fail(found.round, f"the healed world's replica check failed at step {plan.step}")
            health.metrics.healed(plan.lost, sent)
        number = begin_world(fence, plan.step, rank)
        seconds = time.perf_counter() - caught
        healed = Healed(
            found.round,
            rank,
            size,
            plan.step,
            plan.lost,
            sent,
            seconds,
            plan.src,
            rank in plan.receivers,
            number,
        )
        self.round = found.round
        report = {"step": plan.step, "lost": plan.lost, "bytes": sent, "seconds": round(seconds, 3)}
        inplace.mark_worker(self.mark, notice.healed_note(found.round, report))
        if rank == 0:
            say_world(size, plan.step, healed=(plan.lost, sent, seconds))
        return healed


def take_extra(subject: Any, extra: Mapping[str, Any]) -> None:
    """A receiver's control state copied from the source: step, epoch, the loss scaler's (where either
    side has one)."""
    subject.step, subject.epoch = extra["step"], extra["epoch"]
    if subject.scaler is not None and extra.get("scaler") is not None:
        subject.scaler.load_state_dict(extra["scaler"])


def begin_world(fence: Callable[[int], int] | None, step: int, rank: int) -> int:
    """Collective, the last of a healed world's start on survivors and joiners alike: rank 0 begins the
    world's checkpoint fence from ``step`` (``fence``; none without checkpoints), and every rank takes its
    number."""
    number: list[Any] = [fence(step) if fence is not None and rank == 0 else 0]
    dist.broadcast_object_list(number, src=0)
    return int(number[0])


def reseed(seed: int, rank: int) -> None:
    """A healed rank's own randomness (dropout), as a restarted one's: ``seed + rank``, its new rank."""
    torch.manual_seed(seed + rank)
