"""Sync health for any DDP loop: :class:`SyncHealth`, the object the reference trainer and users' own code
share.

Built from the model (DDP-wrapped or not) and, optionally, the optimizer and the number of steps, and
called once after each optimizer step, it does what the reference trainer does at a check: copies rank 0's
buffers when DDP broadcasts them, fingerprints parameters, buffers, optimizer state and control state
(step, epoch where known, learning rates, loss scale where known), applies the ``Fail``/``Repair``/``Warn``
policy, keeps the ``ddp_*`` metrics (local rank 0 serves its pod's ranks on ``DDPJOB_METRICS_PORT``), runs
the fire drill (``DDPJOB_CHAOS_DIVERGE``) and, at the end, writes the termination report the operator and
``ddpjob local`` read. Its settings (:class:`ddp_trainer.sync.SyncConfig`, also ``SyncHealth.Config``)
come from the DDPJob (``DDPJOB_SYNC_EVERY``, ``DDPJOB_ON_DIVERGENCE``, ...) unless given, as keywords or
as one config::

    from ddp_trainer.sync import SyncHealth

    with SyncHealth(ddp_model, optimizer, total_steps=steps) as health:
        for batch in batches:
            ...; optimizer.step()
            health.step(loss)

    SyncHealth(ddp_model, optimizer, SyncHealth.Config.from_env(total_steps=steps, every=50))

A check is two small collectives more than :func:`ddp_trainer.sync.check_in_sync`: before the fingerprint
all-reduce every rank contributes a header (its step, its number of tensors, a hash of their names, shapes
and dtypes) to one all-reduce, on a gloo group of its own with a short timeout. Ranks built from different
models, or that disagree on how many steps they took, get a :class:`SyncHealthError` naming the cause
within ``peer_timeout`` seconds instead of a collective that hangs until the job's timeout.

Long because it is the one public object: setup from the environment, the step, the check, the close.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from ddp_trainer import contract
from ddp_trainer.core import inplace, wrappers
from ddp_trainer.core.config import PodEnv, read_pod_env
from ddp_trainer.core.distributed import LaunchEnv, metrics_dir, read_launch_env, settle_gloo_at_exit
from ddp_trainer.core.lossread import LossReader
from ddp_trainer.reporting import report
from ddp_trainer.sync import boundary, fingerprints, probe, replicas, sharded
from ddp_trainer.sync import sdc as sdc_drill
from ddp_trainer.sync.settings import SyncConfig
from ddp_trainer.sync.settings import SyncHealthError as SyncHealthError
from ddp_trainer.sync.verify import CheckKind, DivergenceError, Tally, Verifier, broadcast_state, check_state
from ddp_trainer.sync.verify import model_digest as digest_of

if TYPE_CHECKING:  # prometheus_client loads only after PROMETHEUS_MULTIPROC_DIR is set (see _metrics)
    from ddp_trainer.reporting.metrics import TrainerMetrics

log = logging.getLogger("ddp_trainer")

MIN_TORCH = (2, 4)
_PRECISIONS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
"""``ddp_info``'s precision for code the trainer does not configure: the parameters' dtype."""
_REPORTED = (contract.DIVERGENCE_EXIT_CODE, contract.FAULTY_RANK_EXIT_CODE)
"""Exit codes :class:`SyncHealth` raises (``SystemExit``) after writing the report itself."""
_SERVED: set[int] = set()  # ports this process serves metrics on


def _verdict_exit(code: int) -> SystemExit:
    """The ``SystemExit`` a verdict ends the process with (its report written). In a launched worker
    (torchrun sets ``TORCHELASTIC_RUN_ID``) an exit handler, run first, then leaves with ``os._exit(code)``:
    the interpreter's teardown with the script's process group still alive can abort the process (torch's
    gloo: "terminate called without an active exception", SIGABRT), and the launcher would then report
    the abort instead of the verdict."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        atexit.register(inplace.exit_now, code)
    return SystemExit(code)


@dataclass
class Tracked:
    """The :class:`ddp_trainer.sync.verify.Subject` of a loop that :class:`SyncHealth` does not own."""

    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    scaler: torch.amp.GradScaler | None
    step: int = 0
    epoch: int | None = None


def say_world(world_size: int, step: int) -> None:
    """An elastic job's new world, verified before its first step, on stderr as the built-in trainer logs
    it (``ddpjob local`` lists each world from these lines: :data:`ddp_trainer.contract.ELASTIC_WORLD_LOG`).
    Every resize restarts the workers, so a script's ``SyncHealth`` (or the hook's) is built anew in each
    world and says it once."""
    print(
        f"{contract.log_stamp(time.time())} [rank 0] {contract.ELASTIC_WORLD_LOG} world size {world_size} "
        f"verified at step {step}, before its first step",
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


class SyncHealth:
    """Sync health of one DDP model: checks, policy, metrics, progress and the termination report.

    Collective: every rank builds it at the same point (after the model is wrapped in DDP, or at least
    after every rank holds its copy) and calls :meth:`step` after each optimizer step. Building it runs
    the initial check. Under ``Fail`` a divergence writes the report and exits the process with
    :data:`ddp_trainer.contract.DIVERGENCE_EXIT_CODE` (``SystemExit``), on every rank at the same check.

    ``config`` (a :class:`SyncHealth.Config`, that is :class:`ddp_trainer.sync.SyncConfig`) holds the
    settings: the check's interval and policy, ``total_steps``, the compute probe's
    (:mod:`ddp_trainer.sync.probe`), buffers, timeouts, the report. Without one they come from
    ``SyncHealth.Config.from_env(env, **settings)``: each setting given as a keyword (``every=50``,
    ``on_divergence="Repair"``, ...), else the DDPJob's environment (``DDPJOB_SYNC_EVERY``,
    ``DDPJOB_ON_DIVERGENCE``, ``DDPJOB_PROBE_EVERY``, ``DDPJOB_ON_FAULTY_RANK``), else the defaults (100,
    ``Fail``, 1000, ``Fail``); with one, keywords given replace its values.

    The objects it works with are keyword arguments of their own: ``group`` (the process group),
    ``scaler`` (a ``torch.amp.GradScaler``, whose scale is compared), ``state`` (an existing train state to
    check instead of counting steps here: the reference trainer's), ``pod`` (the ``DDPJOB_*`` settings,
    instead of reading them from the environment), ``metrics`` (existing series; then nothing is served
    here), ``env`` (the environment read instead of ``os.environ``), and what the compute probe runs:
    ``probe_batch``, ``probe_loss``, ``probe_step`` (default: the first input the model saw on rank 0).
    """

    Config: ClassVar[type[SyncConfig]] = SyncConfig
    """The settings as one value: :class:`ddp_trainer.sync.settings.SyncConfig`."""

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
        self.metrics.sync_every.set(self.every)
        if self.total_steps is not None:
            self.metrics.total_steps.set(self.total_steps)
        self.verifier = Verifier(self.policy, self.metrics, check=self._check, repair=self._repair)
        self.skew = boundary.SkewMeter()
        self._losses = LossReader()
        self.closed = False
        self.last_report: contract.Report | None = None
        # The header's own group: gloo (CPU) with a short timeout, so a peer that never comes is noticed.
        ranks = None if group is None else dist.get_process_group_ranks(group)
        peers = dist.new_group(ranks=ranks, backend="gloo", timeout=timedelta(seconds=self.peer_timeout))
        settle_gloo_at_exit()  # the check's collectives, and the script's, end before the interpreter
        self.peers = peers if isinstance(peers, dist.ProcessGroup) else None
        self.restart = self._restarts(environ)
        """The gang restarts done in place in this attempt, and the cause of the last (every rank's)."""
        self.metrics.restarts.set(contract.restarts_before(self.pod.attempt) + self.restart.restarts)
        self.metrics.restarted(self.restart.restarts, self.restart.cause)
        self._start_probe(model, probe_batch, probe_loss, probe_step)
        self._last = time.perf_counter()
        if config.initial_check:
            self.check("initial")
            if self._owns_steps and ":" in environ.get(contract.PET_NNODES, "") and self.rank == 0:
                say_world(self.world_size, self.current_step)
        # an elastic world that changed: why, and what it cost (the launcher's record)
        self.metrics.resized(inplace.read_state(environ), time.time())

    # -- setup ----------------------------------------------------------------------------------------

    def _metrics(self, environ: Mapping[str, str], model: nn.Module) -> TrainerMetrics:
        """This rank's ``ddp_*`` series; local rank 0 serves its pod's on ``DDPJOB_METRICS_PORT``."""
        directory = metrics_dir(os.environ, self.launch)  # before prometheus_client loads
        values = sys.modules.get("prometheus_client.values")
        if values is not None and "PROMETHEUS_MULTIPROC_DIR" in os.environ:  # loaded earlier by the user
            values.ValueClass = values.get_value_class()  # type: ignore[attr-defined]
        from ddp_trainer.reporting import metrics as metrics_module

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
        if (
            self.launch.local_rank == 0
            and port
            and port not in _SERVED
            and metrics_module.serve(port, directory)
        ):
            _SERVED.add(port)
        return series

    def _start_probe(
        self,
        model: nn.Module,
        batch: Any,
        loss: Callable[[nn.Module], torch.Tensor] | None,
        step: probe.StepFn | None,
    ) -> None:
        """The compute probe (:mod:`ddp_trainer.sync.probe`) when on, and the SDC fire drill when it names
        this rank."""
        self.probe_every, self.on_faulty_rank = self.config.probe_every, self.config.on_faulty_rank
        self.probes = 0
        self.last_probe: probe.ProbeResult | None = None
        self.faulty_found = 0
        self.last_faulty: probe.ProbeResult | None = None
        self.prober: probe.Probe | None = None
        if self.probe_every and self.layout is not None:
            self.probe_every = 0
            log.log(
                logging.WARNING if self.rank == 0 else logging.DEBUG,
                "the compute probe is off for %s: a sharded forward is collective over the shard "
                "dimension, so one rank's compute cannot be told apart (docs/your-code.md, HSDP)",
                self.layout.kind,
            )
        if self.probe_every:
            group = self.peers if self.peers is not None else self.group
            self.prober = probe.Probe(
                model, group=group, batch=batch, loss=loss, step=step, node=self.pod.node
            )
            self.metrics.start_probe(self.probe_every, self.pod.node, self.prober.pod)
        sdc = self.pod.sdc
        if sdc is not None and sdc.rank == self.rank:
            sdc_drill.install_sdc_drill(model, lambda: self.current_step >= sdc.step)
            log.warning(
                "fire drill: rank %d computes wrong after step %d (%s)",
                self.rank,
                sdc.step,
                contract.CHAOS_SDC_ENV,
            )

    # -- the step -------------------------------------------------------------------------------------

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
        return inplace.LaunchState(count, best.cause, min(state.at for state in latest))

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
            raise _verdict_exit(contract.DIVERGENCE_EXIT_CODE) from err

    # -- the compute probe -----------------------------------------------------------------------------

    def probe_due(self) -> bool:
        """Whether the compute probe runs at this step (right after the check it needs)."""
        return self.prober is not None and probe.due(self.current_step, self.probe_every)

    def run_probe(self) -> probe.ProbeResult:
        """One compute probe now (collective; call right after a check that passed): metrics, log, and
        under ``onFaultyRank: Fail`` a :class:`ddp_trainer.sync.probe.FaultyRankError` when a rank is named
        faulty. Undecidable and flaky verdicts are said, never acted on."""
        assert self.prober is not None, "the compute probe is off"
        result = self.prober.run(self.current_step)
        self.probes += 1
        self.last_probe = result
        kind = result.verdict.kind
        if self.metrics.probe is not None:
            named = self.rank in result.verdict.ranks
            self.metrics.probe.observe(kind, named, result.seconds, time.time())
        if kind == "agree":
            return result
        if self.rank == 0:
            log.warning("%s", result.message)
        if kind == "faulty":
            self.faulty_found += 1
            self.last_faulty = result
            if self.on_faulty_rank == "Fail":
                raise probe.FaultyRankError(result)
        return result

    def _probed(self) -> None:
        """A probe from :meth:`step`: a faulty rank under ``Fail`` writes the report and exits."""
        try:
            self.run_probe()
        except probe.FaultyRankError as err:
            self.close(err)
            raise _verdict_exit(contract.FAULTY_RANK_EXIT_CODE) from err

    # -- the check ------------------------------------------------------------------------------------

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

    # -- the end --------------------------------------------------------------------------------------

    def close(self, error: BaseException | None = None, *, collective: bool = True) -> None:
        """The final check (when the run ended normally and the last step was not checked) and the
        termination report (local rank 0 writes it); idempotent. A divergence at the final check under
        ``Fail`` exits like one at any other check. ``collective=False``: the process group is gone, so
        only the report (of the checks done so far)."""
        if self.closed:
            return
        self.closed = True
        try:
            self._close(error, collective)
        finally:
            self._release_peers()

    def _release_peers(self) -> None:
        """Destroy the header's own gloo group once the last check is done, so no thread of it outlives the
        run into the interpreter's exit (where a gloo group left alive can abort the process)."""
        peers, self.peers = self.peers, None
        if peers is not None and dist.is_initialized():
            try:
                dist.destroy_process_group(peers)
            except Exception as err:  # the run's result stands; say it once
                log.debug("could not destroy the sync check's own group: %s", err)

    def _close(self, error: BaseException | None, collective: bool) -> None:
        if error is None and not collective:
            self._publish(*self.finished())
        elif error is None:
            try:
                if self.tally.last_check_step != self.current_step:
                    self.check("final")
                else:
                    self.agree(
                        "end-of-run agreement"
                    )  # the ranks end at the same step (cheap: one small all-reduce)
            except DivergenceError as err:
                self._publish(*self.diverged(err))
                raise _verdict_exit(contract.DIVERGENCE_EXIT_CODE) from err
            except BaseException as err:
                self._publish(*self.failed(err))
                raise
            self._publish(*self.finished())
        elif isinstance(error, DivergenceError):
            self._publish(*self.diverged(error))
        elif isinstance(error, probe.FaultyRankError):
            self._publish(*self.faulty(error))
        elif isinstance(error, KeyboardInterrupt):
            self._publish(*self.finished())  # the step count says it stopped early
        else:
            self._publish(*self.failed(error))

    def facts(self) -> report.RunFacts:
        return report.RunFacts(self.current_step, self.world_size, self.resumed_from, self.pod.attempt)

    def finished(self) -> tuple[int, contract.Report]:
        total = self.total_steps if self.total_steps is not None else self.current_step
        code, rep = report.finished(self.tally, self.facts(), total, digest_of(self.subject.model))
        return code, self.probe_summary(rep)

    def probe_summary(self, rep: contract.Report) -> contract.Report:
        """``rep`` with the probes run, the last one's verdict and why, and, when one named a faulty rank
        (under ``Warn``), where."""
        if self.prober is not None:
            rep["probes"] = self.probes
        if (last := self.last_probe) is not None:
            rep["probeVerdict"], rep["probeWhy"] = last.verdict.kind, last.message
        if (found := self.last_faulty) is not None:
            report.with_faulty(rep, found)
        return rep

    def faulty(self, err: probe.FaultyRankError) -> tuple[int, contract.Report]:
        found = err.result
        code, rep = report.faulty(found, self.tally, self.facts())
        rep["probes"] = self.probes
        return code, rep

    def diverged(self, err: DivergenceError) -> tuple[int, contract.Report]:
        return report.diverged(self.tally, self.facts(), err.reason, str(err))

    def failed(self, err: BaseException) -> tuple[int, contract.Report]:
        """The report when the user's code raised: reason ``CommandError`` (not the built-in trainer's)."""
        message = f"{type(err).__name__}: {err}"
        return report.failed(message, self.tally, self.facts(), reason=contract.COMMAND_ERROR)

    def _publish(self, code: int, rep: contract.Report) -> None:
        if self.layout is not None:
            rep["sharding"] = self.layout.describe()
        self.last_report = rep
        if not self.write_report:
            return
        if self.launch.local_rank == 0:
            report.write_termination_message(self.pod.termination_log, rep)
        if self.rank == 0:
            log.info("sync health report: %s", report.termination_message(rep))

    def close_on_uncaught_exception(self) -> None:
        """Write the report also when an exception nobody catches ends the process (for frameworks whose
        loops give a callback no way to see it): chains ``sys.excepthook``."""
        previous = sys.excepthook

        def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
            if not (isinstance(error, SystemExit) and error.code in _REPORTED):
                self.close(error)
            previous(kind, error, tb)

        sys.excepthook = hook

    def __enter__(self) -> SyncHealth:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(error, SystemExit) and error.code in _REPORTED:
            return  # the report is written
        self.close(error)
