"""A user's own loop that heals in place (issue 57, item 6): :class:`HealingSyncHealth`, a
:class:`~ddp_trainer.sync.health.SyncHealth` that wraps the model in DDP itself and runs each step through
one call, :meth:`HealingSyncHealth.train_step`, which answers "go on" or "the world changed". Under a
launcher that heals (an elastic DDPJob with ``DDPJOB_HEAL=1``), the step whose collective failed because a
peer was lost is dropped, the process re-forms its group in place and keeps its module and optimizer, and the
world's replicas are verified before the next step; a node that joins copies its state from a live replica
when the object is built. It is the built-in trainer's heal (:mod:`ddp_trainer.sync.heal`,
:mod:`ddp_trainer.sync.join`), in the same order of collectives, so a user's survivors and joiners meet
as the built-in trainer's do::

    model = Net()                                   # not wrapped: the object wraps it, and wraps it again
    optimizer = torch.optim.AdamW(model.parameters())
    step = my_resume(model, optimizer)              # from the last checkpoint, as before heals
    config = SyncHealth.Config.from_env(total_steps=steps, start_step=step)
    with HealingSyncHealth(model, optimizer, config) as health:
        while health.current_step < steps:
            health.train_step(one_step)  # one_step(world) -> loss: world.model, .step, .rank, .size

Without a launcher that heals (plain torchrun, a rigid job, ``DDPJOB_HEAL`` unset) the same code runs as a
plain ``SyncHealth``: a lost peer's error is raised, and the launcher restarts the workers as before.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_trainer.core.distributed import read_launch_env
from ddp_trainer.sync import boundary, heal, join
from ddp_trainer.sync.checking import Tracked
from ddp_trainer.sync.health import SyncHealth
from ddp_trainer.sync.settings import SyncConfig, SyncHealthError

if TYPE_CHECKING:  # prometheus_client loads only after PROMETHEUS_MULTIPROC_DIR is set
    from ddp_trainer.reporting.metrics import TrainerMetrics


@dataclass(frozen=True)
class World:
    """What :meth:`HealingSyncHealth.train_step` runs a step in, and answers with."""

    model: DistributedDataParallel
    """The DDP wrapper to call: a new one after each heal (the old one's reducer was the old group's)."""
    step: int
    """Optimizer steps completed: the step to take is ``step + 1`` (its data: the ``step``-th share)."""
    rank: int
    size: int
    changed: bool = False
    """The world changed during this call: healed in place (``healed`` says what it cost)."""
    healed: heal.Healed | None = None


def loss_and_samples(out: Any) -> tuple[Any, int | None]:
    """A step function's result as ``SyncHealth.step`` takes it: a loss, or ``(loss, samples)``."""
    if isinstance(out, tuple) and len(out) == 2:
        return out[0], out[1]
    return out, None


class HealingSyncHealth(SyncHealth):
    """:class:`SyncHealth` for a loop that heals in place: built on every rank from the model *not yet*
    wrapped in DDP (``ddp``: the wrapper's keyword options, e.g. ``device_ids``), the optimizer of its
    parameters and the settings; :meth:`train_step` runs each step. A DDP model on the default gloo group
    heals (``DDPJOB_HEAL=1`` under ddpjob's launcher); elsewhere it is the plain object, the error raised."""

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        config: SyncConfig | None = None,
        *,
        ddp: Mapping[str, Any] | None = None,
        scaler: torch.amp.GradScaler | None = None,
        env: Mapping[str, str] | None = None,
        **objects: Any,
    ) -> None:
        if isinstance(module, DistributedDataParallel):
            raise SyncHealthError(
                "module: HealingSyncHealth wraps the model in DDP itself (and again after a heal): pass "
                "the module, not its DistributedDataParallel wrapper (ddp={...} for the wrapper's options)"
            )
        if objects.keys() & {"group", "state"}:
            raise SyncHealthError(
                "HealingSyncHealth heals a DDP model on the default group, counting its own steps: "
                "build a SyncHealth for a group of your own or a train state of yours"
            )
        environ: Mapping[str, str] = os.environ if env is None else env
        config = SyncConfig.from_env(environ) if config is None else config
        armed = heal.armed_here(environ)
        # a node that starts in a world whose survivors heal meets them first: their state, not storage's
        mine = Tracked(module, optimizer, scaler, config.start_step)
        joined = join.join(mine) if armed else None
        if joined is not None:
            config = config.replace(start_step=mine.step)
        wrapped = DistributedDataParallel(module, **dict(ddp or {}))
        policy = config.on_divergence
        # a joiner's first check only reports, as the survivors' (join.joined refuses a mismatch)
        settings = config.replace(on_divergence="Warn") if joined is not None else config
        self.joining = joined is not None  # then the heal says the world (join.joined), not the constructor
        super().__init__(wrapped, optimizer, settings, scaler=scaler, env=env, **objects)
        self.config = config
        self.healer = heal.Healer() if armed else None
        self.agreement = boundary.StopAgreement()
        if joined is not None:
            self.policy = self.verifier.policy = policy
            join.joined(joined, self, fence=None)

    @property
    def model(self) -> DistributedDataParallel:
        """The DDP wrapper in use (a new one after each heal)."""
        model: DistributedDataParallel = self.subject.model
        return model

    def world(self, healed: heal.Healed | None = None) -> World:
        """This rank's world now (its place: set by the constructor, and by each heal's ``rejoin``)."""
        return World(self.model, self.current_step, self.rank, self.world_size, healed is not None, healed)

    def train_step(self, fn: Callable[[World], Any]) -> World:
        """The one call at the loop's step boundary: run one step, ``fn(world)`` (forward, backward,
        ``optimizer.step()``; it returns the loss, or ``(loss, samples)``), then what ``step()`` does after it
        (metrics, the check when due, the policy). Returns the world to go on in: ``changed`` when it healed
        in place during the call: a lost peer (the step in flight dropped: at most that one is lost), or a
        node that joined (the ranks leave their group together after the step, none lost). The state was
        copied where a rank needed it and every replica verified before this returns. An error no heal
        covers is raised, as are a heal's that failed (:class:`~ddp_trainer.sync.heal.HealFailed`: the
        launcher restarts the workers from your checkpoint, as before heals)."""
        completed = False
        try:
            loss, samples = loss_and_samples(fn(self.world()))
            completed = True
            self.step(loss, samples)
            # every rank asks at every step (a collective): each node's launcher asks its own workers
            if self.healer is not None and self.agreement.agree(False, self.healer.grow_requested())[1]:
                raise heal.WorldGrows(self.current_step)
        except Exception as err:
            healed = self._heal(err, dropped=not completed)
            if healed is None:
                raise
            return self.world(healed)
        return self.world()

    def _heal(self, err: Exception, *, dropped: bool) -> heal.Healed | None:
        """Heal from ``err`` (:meth:`heal.Healer.heal`); None where it is not one to heal from."""
        if self.healer is None:
            return None
        module = self.model.module
        healed = self.healer.heal(
            err,
            self.subject,
            dropped=dropped,
            health=self,
            metrics=lambda: self._world_metrics(module),
        )
        if healed is not None:
            self.agreement = boundary.StopAgreement()
        return healed

    def _world_metrics(self, module: nn.Module) -> TrainerMetrics:
        """This rank's series made anew for the healed world: its new rank, size and launcher variables."""
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.launch = read_launch_env(os.environ)
        return self._metrics(os.environ, module, anew=True)
