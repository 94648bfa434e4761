"""Sync health for any DDP loop: :class:`SyncHealth`, the object the reference trainer and users' own code
share.

Built from the model (DDP-wrapped or not) and, optionally, the optimizer and its settings, and called once
after each optimizer step, it does what the reference trainer does at a check: copies rank 0's buffers when
DDP broadcasts them, fingerprints parameters, buffers, optimizer state and control state (step, epoch where
known, learning rates, loss scale where known), applies the ``Fail``/``Repair``/``Warn`` policy, keeps the
``ddp_*`` metrics (local rank 0 serves its pod's ranks on ``DDPJOB_METRICS_PORT``), runs the fire drill
(``DDPJOB_CHAOS_DIVERGE``) and, at the end, writes the termination report the operator and ``ddpjob local``
read. Its settings are one :class:`ddp_trainer.sync.SyncConfig` (also ``SyncHealth.Config``), by default
from the DDPJob (``DDPJOB_SYNC_EVERY``, ``DDPJOB_ON_DIVERGENCE``, ...)::

    from ddp_trainer.sync import SyncHealth

    config = SyncHealth.Config.from_env(total_steps=steps, every=50)
    with SyncHealth(ddp_model, optimizer, config) as health:
        for batch in batches:
            ...; optimizer.step()
            health.step(loss)

The settings as keywords of ``SyncHealth`` itself (``SyncHealth(model, optimizer, total_steps=steps)``) still
work, deprecated: a ``DeprecationWarning`` names the config that says the same.

This module builds it and runs the step; the rest is split by concern, each a class ``SyncHealth`` inherits
from: the check (:mod:`ddp_trainer.sync.checking`), the compute probe (:mod:`ddp_trainer.sync.probing`) and
the end, with the report (:mod:`ddp_trainer.sync.closing`). Long because building it is most of what is left:
its inputs checked, its metrics served, the restarts in place its peers know of, the probe started.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from ddp_trainer import contract
from ddp_trainer.core import inplace, wrappers
from ddp_trainer.core.config import PodEnv, read_pod_env
from ddp_trainer.core.distributed import LaunchEnv, metrics_dir, read_launch_env, settle_gloo_at_exit
from ddp_trainer.core.lossread import LossReader
from ddp_trainer.sync import boundary, fingerprints, probe, replicas, sharded
from ddp_trainer.sync.boundary import CheckKind
from ddp_trainer.sync.checking import DivergenceError, Tracked, Verifier
from ddp_trainer.sync.closing import Closing, verdict_exit
from ddp_trainer.sync.settings import SyncConfig, deprecated_settings
from ddp_trainer.sync.settings import SyncHealthError as SyncHealthError

if TYPE_CHECKING:  # prometheus_client loads only after PROMETHEUS_MULTIPROC_DIR is set (see _metrics)
    from ddp_trainer.reporting.metrics import TrainerMetrics

log = logging.getLogger("ddp_trainer")

MIN_TORCH = (2, 4)
_PRECISIONS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
"""``ddp_info``'s precision for code the trainer does not configure: the parameters' dtype."""
_SERVED: set[int] = set()  # ports this process serves metrics on


def say_world(world_size: int, step: int, healed: tuple[int, int, float] | None = None) -> None:
    """An elastic job's new world, verified before its first step, on stderr as the built-in trainer logs
    it (``ddpjob local`` lists each world from these lines: :data:`ddp_trainer.contract.ELASTIC_WORLD_LOG`).
    A resize that restarts the workers builds a script's ``SyncHealth`` (or the hook's) anew in each world,
    which says it once; a world healed in place (``healed``: steps lost, bytes sent, seconds) says so."""
    how = ""
    if healed is not None:
        lost, sent, seconds = healed
        how = f" {contract.HEALED_WORLD_LOG}{lost} step(s) lost, {sent} bytes sent, {seconds:.2f} s)"
    print(
        f"{contract.log_stamp(time.time())} [rank 0] {contract.ELASTIC_WORLD_LOG} world size {world_size} "
        f"verified at step {step}, before its first step{how}",
        file=sys.stderr,
        flush=True,
    )


def torch_version_ok(version: str) -> bool:
    """Whether ``version`` (``torch.__version__``) is at least :data:`MIN_TORCH`."""
    try:
        major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        return True  # a development build: give it the benefit of the doubt
    return (major, minor) >= MIN_TORCH


def config_of(options: Mapping[str, Any]) -> tuple[SyncConfig, dict[str, Any]]:
    """Keyword options that mix settings and objects (a callback's: ``SyncHealthCallback(every=50)``) as
    ``SyncHealth`` takes them: the settings as one config (:meth:`SyncConfig.from_env`, reading ``env`` when
    one is among the options), and the other keywords."""
    settings = {name: value for name, value in options.items() if name in SyncConfig.names()}
    others = {name: value for name, value in options.items() if name not in settings}
    return SyncConfig.from_env(others.get("env"), **settings), others


class SyncHealth(Closing):
    """Sync health of one DDP model: checks, policy, metrics, progress and the termination report.

    Collective: every rank builds it at the same point (after the model is wrapped in DDP, or at least
    after every rank holds its copy) and calls :meth:`step` after each optimizer step. Building it runs
    the initial check. Under ``Fail`` a divergence writes the report and exits the process with
    :data:`ddp_trainer.contract.DIVERGENCE_EXIT_CODE` (``SystemExit``), on every rank at the same check.

    ``config`` (a :class:`SyncHealth.Config`, that is :class:`ddp_trainer.sync.SyncConfig`) holds the
    settings: the check's interval and policy, ``total_steps``, the compute probe's
    (:mod:`ddp_trainer.sync.probe`), buffers, timeouts, the report. Without one it is
    ``SyncHealth.Config.from_env(env)``: the DDPJob's environment (``DDPJOB_SYNC_EVERY``,
    ``DDPJOB_ON_DIVERGENCE``, ``DDPJOB_PROBE_EVERY``, ``DDPJOB_ON_FAULTY_RANK``), else the defaults (100,
    ``Fail``, 1000, ``Fail``). The settings as keywords (``every=50``, ...) are deprecated: they still go
    into ``from_env`` (or replace the given config's values), with a ``DeprecationWarning`` naming the
    config that says the same (:func:`deprecated_settings`).

    The objects it works with are keyword arguments of their own: ``group`` (the process group),
    ``scaler`` (a ``torch.amp.GradScaler``, whose scale is compared), ``state`` (an existing train state to
    check instead of counting steps here: the reference trainer's), ``pod`` (the ``DDPJOB_*`` settings,
    instead of reading them from the environment), ``metrics`` (existing series; then nothing is served
    here), ``env`` (the environment read instead of ``os.environ``), and what the compute probe runs:
    ``probe_batch``, ``probe_loss``, ``probe_step`` (default: the first input the model saw on rank 0).
    """

    Config: ClassVar[type[SyncConfig]] = SyncConfig
    """The settings as one value: :class:`ddp_trainer.sync.settings.SyncConfig`."""

    joining = False
    """A fresh rank joining a world healed in place (:mod:`ddp_trainer.sync.healing`): the heal says it."""

    built: ClassVar[int] = 0
    """How many were built in this process (the no-code-change hook stands down when the script builds
    its own: :mod:`ddp_trainer.hook.autoinstrument`)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        config: SyncConfig | None = None,
        *,
        group: dist.ProcessGroup | None = None,
        scaler: torch.amp.GradScaler | None = None,
        state: Any = None,
        pod: PodEnv | None = None,
        metrics: TrainerMetrics | None = None,
        env: Mapping[str, str] | None = None,
        probe_batch: Any = None,
        probe_loss: Callable[[nn.Module], torch.Tensor] | None = None,
        probe_step: probe.StepFn | None = None,
        **settings: Any,
    ) -> None:
        unknown = sorted(settings.keys() - SyncConfig.names())
        if unknown:
            raise TypeError(f"SyncHealth.__init__() got an unexpected keyword argument {unknown[0]!r}")
        if settings:
            warnings.warn(deprecated_settings(settings, config is not None), DeprecationWarning, stacklevel=2)
        environ: Mapping[str, str] = os.environ if env is None else env
        if not torch_version_ok(torch.__version__):
            raise SyncHealthError(
                f"torch {torch.__version__} is not supported: SyncHealth needs torch "
                f">= {MIN_TORCH[0]}.{MIN_TORCH[1]}"
            )
        if not isinstance(model, nn.Module):
            raise SyncHealthError(
                f"model: expected a torch.nn.Module (DDP-wrapped or not), got {type(model)!r}"
            )
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise SyncHealthError(
                f"optimizer: expected a torch.optim.Optimizer or None, got {type(optimizer)!r}"
            )
        if config is not None and not isinstance(config, SyncConfig):
            raise SyncHealthError(f"config: expected a SyncHealth.Config or None, got {type(config)!r}")
        config = SyncConfig.from_env(environ, **settings) if config is None else config.replace(**settings)
        if not dist.is_available() or not dist.is_initialized():
            raise SyncHealthError(
                "torch.distributed is not initialized: build SyncHealth after init_process_group() (under "
                "torchrun), on every rank"
            )
        self.layout = sharded.layout(model)
        """How an FSDP2 model's parameters lie (HSDP: the replica groups compared); None for DDP."""
        if self.layout is not None and self.layout.group is None:
            raise SyncHealthError(f"{sharded.FSDP_ONLY}: build SyncHealth for a DDP or an HSDP model")
        SyncHealth.built += 1
        self.config = config
        """The settings it runs with (the keywords given folded in)."""
        self.every, self.policy = config.every, config.on_divergence
        self.total_steps = config.total_steps
        self.check_buffers = config.check_buffers
        self.group = group
        self.compared = self.layout.group if self.layout is not None else group
        """The group whose ranks hold the same bytes: ``group``, or this rank's HSDP replica group."""
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size(group)
        self.launch: LaunchEnv = read_launch_env(environ)
        self.pod: PodEnv = pod if pod is not None else read_pod_env(environ)
        self.broadcast_buffers = config.broadcast_buffers
        self.peer_timeout = config.peer_timeout
        self.subject: Any = (
            state if state is not None else Tracked(model, optimizer, scaler, config.start_step)
        )
        self._owns_steps = state is None
        self.resumed_from = self.current_step
        """The step this run (this world, in an elastic job) started from: 0, or the resumed state's."""
        self.write_report = config.write_report
        self.metrics = metrics if metrics is not None else self._metrics(environ, model)
        self.verifier = Verifier(self.policy, self.metrics, check=self._check, repair=self._repair)
        self.skew = boundary.SkewMeter()
        self._losses = LossReader()
        self.closed = False
        self.last_report: contract.Report | None = None
        self._probe_with = (probe_batch, probe_loss, probe_step)
        checked = self._enter_world(environ, model, first=True) is not None
        elastic = ":" in environ.get(contract.PET_NNODES, "")
        if checked and self._owns_steps and elastic and not self.joining and self.rank == 0:
            say_world(self.world_size, self.current_step)
        # an elastic world that changed: why, and what it cost (the launcher's record)
        self.metrics.resized(inplace.read_state(environ), time.time())

    def _enter_world(
        self, environ: Mapping[str, str], model: nn.Module, *, first: bool
    ) -> replicas.SyncReport | None:
        """The collectives of a world's start, after the model is wrapped: the header's group, the restarts
        gather, the compute probe's start, the initial check (its report; None when off). One sequence for
        the constructor and :meth:`rejoin`, so a healed survivor and a fresh rank of one world run the same
        collectives in the same order."""
        # The header's own group: gloo (CPU) with a short timeout, so a peer that never comes is noticed.
        ranks = None if self.group is None else dist.get_process_group_ranks(self.group)
        peers = dist.new_group(ranks=ranks, backend="gloo", timeout=timedelta(seconds=self.peer_timeout))
        settle_gloo_at_exit()  # the check's collectives, and the script's, end before the interpreter
        self.peers = peers if isinstance(peers, dist.ProcessGroup) else None
        self.restart = self._restarts(environ)
        """The gang restarts done in place in this attempt, and the cause of the last (every rank's)."""
        # every rank took part in this rank's start-up gather: a lost peer now fails a collective at once,
        # where before it left the workers waiting in the workers' store (launch.silence, launch.workers)
        inplace.mark_worker(inplace.worker_mark(environ, os.getpid()), inplace.FORMED)
        self.metrics.sync_every.set(self.every)
        if self.total_steps is not None:
            self.metrics.total_steps.set(self.total_steps)
        self.metrics.restarts.set(contract.restarts_before(self.pod.attempt) + self.restart.restarts)
        self.metrics.restarted(self.restart.restarts, self.restart.cause, self.restart.restart_from)
        self._start_probe(model, *self._probe_with, drill=first)
        self._last = time.perf_counter()
        self.world_checks_from = self.tally.checks
        return self.check("initial") if self.config.initial_check else None

    def rejoin(self, model: nn.Module, metrics: TrainerMetrics | None = None) -> bool:
        """After a heal re-formed the default group (:mod:`ddp_trainer.sync.heal`): take this process's
        place in the new world (rank, size, launcher variables, ``model``: the new DDP wrapper; ``metrics``:
        this rank's series made anew for it, its new rank and world) and run what the constructor runs there
        (:meth:`_enter_world`), then report the world change as the launcher recorded it. Whether the
        initial check found every replica the same: the heal refuses a mismatch whatever the policy, which
        neither raises nor repairs here. Only a DDP model on the default group heals."""
        if self.group is not None or self.layout is not None:
            raise SyncHealthError("a heal re-forms the default group of a DDP model; this one is not")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.launch = read_launch_env(os.environ)
        if self._owns_steps:
            self.subject.model = model  # a state given (the trainer's) holds the caller's wrapper already
        self.skew = boundary.SkewMeter()
        if metrics is not None:
            self.metrics = self.verifier.metrics = metrics
        policy, self.verifier.policy = self.verifier.policy, "Warn"
        try:
            found = self._enter_world(os.environ, model, first=False)
        finally:
            self.verifier.policy = policy
        self.metrics.resized(inplace.read_state(os.environ), time.time())
        return found is None or found.in_sync

    # -- setup ----------------------------------------------------------------------------------------

    def _metrics(self, environ: Mapping[str, str], model: nn.Module, anew: bool = False) -> TrainerMetrics:
        """This rank's ``ddp_*`` series; local rank 0 serves its pod's on ``DDPJOB_METRICS_PORT``. ``anew``:
        for a world healed in place (its new rank and size, in the new world's directory, served instead)."""
        directory = metrics_dir(os.environ, self.launch, anew=anew)  # before prometheus_client loads
        values = sys.modules.get("prometheus_client.values")
        if values is not None and "PROMETHEUS_MULTIPROC_DIR" in os.environ:  # loaded earlier by the user
            values.ValueClass = values.get_value_class()  # type: ignore[attr-defined]
        from ddp_trainer.reporting import metrics as metrics_module
        from ddp_trainer.reporting import serving

        first = next(model.parameters(), None)
        labels = {
            contract.JOB_LABEL: self.pod.job,
            contract.NAMESPACE_LABEL: self.pod.namespace,
            contract.RANK_LABEL: str(self.rank),
            contract.NODE_RANK_LABEL: str(self.launch.node_rank),
        }
        info = {
            "world_size": str(self.world_size),
            "device": first.device.type if first is not None else "cpu",
            "backend": str(dist.get_backend(self.group)),
            "precision": _PRECISIONS.get(first.dtype, str(first.dtype)) if first is not None else "fp32",
            "model": wrappers.model_name(model),
            "attempt": str(self.pod.attempt),
            "torch_version": torch.__version__,
            "fingerprint": fingerprints.impl_for(first.device if first is not None else torch.device("cpu")),
        }
        series = metrics_module.TrainerMetrics(labels, info)
        series.restarts.set(contract.restarts_before(self.pod.attempt))
        port = self.pod.metrics_port
        if self.launch.local_rank == 0 and anew:
            serving.serve_anew(directory)
        elif self.launch.local_rank == 0 and port and port not in _SERVED and serving.serve(port, directory):
            _SERVED.add(port)
        return series

    # -- the step -------------------------------------------------------------------------------------
    def step(self, loss: float | torch.Tensor | None = None, samples: int | None = None) -> None:
        """Call once after each optimizer step: progress metrics; the fire drill; the check when due
        (:func:`ddp_trainer.sync.boundary.check_due`: every ``every`` steps, at ``total_steps`` and before
        a compute probe), with the policy applied."""
        if self._owns_steps:
            self.subject.step += 1
        now = time.perf_counter()
        duration, self._last = now - self._last, now
        self.observe(duration, samples or 0, loss)
        self.drill()
        probing = self.probe_due()
        kind = boundary.check_due(self.current_step, self.every, self.total_steps, probe=probing)
        if kind is not None:
            self._checked(kind)
        if probing and self.tally.last_check_ok:  # only on verified parameters: never a false accusation
            self._probed()

    def observe(self, duration_seconds: float, samples: int, loss: float | torch.Tensor | None) -> None:
        """Record one finished step in the metrics and the step-time skew. A loss on the GPU is read a step
        later, without waiting (:class:`~ddp_trainer.core.lossread.LossReader`): the gauge lags one step
        there."""
        if isinstance(loss, torch.Tensor):
            loss = self._losses.put(loss)
        finite = loss is None or math.isfinite(loss)
        self.metrics.observe_step(self.current_step, duration_seconds, samples, loss, finite, time.time())
        self.skew.add(duration_seconds)

    def drill(self) -> None:
        """The fire drill: when ``DDPJOB_CHAOS_DIVERGE`` names this rank and step, nudge one parameter."""
        step = self.current_step
        if boundary.drill_fires(self.pod.chaos, self.rank, step):
            name = boundary.nudge(self.subject.model)
            log.warning(
                "fire drill: rank %d nudged %s by %g at step %d", self.rank, name, boundary.CHAOS_NUDGE, step
            )
        if boundary.drill_fires(self.pod.crash, self.rank, step) and self._first_run():
            # logged at ERROR so every rank's line shows (the recovery benchmark reads its timestamp)
            log.error("fire drill: rank %d kills itself (SIGKILL) after step %d", self.rank, step)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)

    def _restarts(self, environ: Mapping[str, str]) -> inplace.LaunchState:
        """This attempt's restarts in place as the whole gang knows them: each pod's launcher saw only its
        own side (the failing rank's cause on its pod, "another node" elsewhere), so under a launcher the
        ranks share theirs (one small all-gather at start) and keep the cause that names a rank best."""
        own = inplace.read_state(environ)
        if contract.LAUNCH_STATE_ENV not in environ or self.peers is None:
            return own
        states: list[inplace.LaunchState | None] = [None] * dist.get_world_size(self.peers)
        dist.all_gather_object(states, own, group=self.peers)
        known = [state for state in states if state is not None]
        count = max(state.restarts for state in known)
        latest = [state for state in known if state.restarts == count]
        best = min(latest, key=lambda state: contract.blame(state.cause))
        if count and self.rank == 0:
            log.warning("gang restart in place %d of this attempt: %s", count, best.cause)
        at = min(state.at for state in latest)
        return inplace.LaunchState(count, best.cause, at, restart_from=best.restart_from)

    def _first_run(self) -> bool:
        """The first run of attempt 1 (no gang restart of either kind yet): when the recovery drill fires."""
        restarts = inplace.read_state(os.environ).restarts
        return self.pod.attempt == contract.FIRST_ATTEMPT and not restarts

    def _checked(self, kind: CheckKind) -> None:
        """A check from :meth:`step`: a divergence under ``Fail`` writes the report and exits."""
        try:
            self.check(kind)
        except DivergenceError as err:
            self.close(err)
            raise verdict_exit(contract.DIVERGENCE_EXIT_CODE) from err

    def _probed(self) -> None:
        """A probe from :meth:`step`: a faulty rank under ``Fail`` writes the report and exits."""
        try:
            self.run_probe()
        except probe.FaultyRankError as err:
            self.close(err)
            raise verdict_exit(contract.FAULTY_RANK_EXIT_CODE) from err
