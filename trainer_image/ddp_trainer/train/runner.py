"""One trainer process from start to report: seed, build, restore, wrap in DDP, verify, train, verify.

:class:`Session` only assembles: the checks, their policy, the step metrics and the fire drill are the
same :class:`ddp_trainer.sync.health.SyncHealth` users put in their own loops, what else happens between steps
:mod:`ddp_trainer.sync.boundary`, the loop :mod:`ddp_trainer.train.loop`, the report
:mod:`ddp_trainer.reporting.report`; :meth:`Session.on_step` plugs them into the loop. Where the launcher
heals (``DDPJOB_HEAL=1``, gloo), a lost peer's error is healed in place (:mod:`ddp_trainer.sync.heal`) and
the loop re-entered at the healed world's step. Long because that loop sits beside the run it re-enters.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import torch
import torch.distributed as dist
from prometheus_client import values
from torch.nn.parallel import DistributedDataParallel

from ddp_trainer import contract
from ddp_trainer.checkpoint import checkpoints, payload, provenance
from ddp_trainer.core import inplace
from ddp_trainer.core.config import PodEnv, TrainerConfig
from ddp_trainer.core.distributed import LaunchEnv, metrics_dir, read_launch_env
from ddp_trainer.core.state import TrainState
from ddp_trainer.reporting import report
from ddp_trainer.reporting.metrics import TrainerMetrics
from ddp_trainer.reporting.serving import serve_anew
from ddp_trainer.sync import boundary, fingerprints, heal, join, probe, replicas
from ddp_trainer.sync.boundary import CheckKind
from ddp_trainer.sync.checking import DivergenceError, Tally, model_digest
from ddp_trainer.sync.health import SyncHealth
from ddp_trainer.train.data import build_dataset, elastic_batches, global_batch, micro_batches
from ddp_trainer.train.loop import Batches, Precision, StepResult, train
from ddp_trainer.train.model import build_model, compute_loss

log = logging.getLogger("ddp_trainer")


def rank_metrics(
    config: TrainerConfig, pod: PodEnv, launch: LaunchEnv, device: torch.device, precision: str
) -> TrainerMetrics:
    """This rank's series, labelled and described, ``ddp_restarts`` set."""
    labels = {
        contract.JOB_LABEL: pod.job,
        contract.NAMESPACE_LABEL: pod.namespace,
        contract.RANK_LABEL: str(launch.rank),
        contract.NODE_RANK_LABEL: str(launch.node_rank),
    }
    info = {
        "world_size": str(launch.world_size),
        "device": device.type,
        "backend": dist.get_backend(),
        "precision": precision,
        "model": config.model,
        "attempt": str(pod.attempt),
        "torch_version": torch.__version__,
        "fingerprint": fingerprints.impl_for(device),
    }
    metrics = TrainerMetrics(labels, info)
    metrics.restarts.set(contract.restarts_before(pod.attempt))  # SyncHealth adds the restarts in place
    metrics.sync_every.set(config.sync_every)
    return metrics


class Session:
    """One trainer process between setup and report."""

    def __init__(
        self,
        config: TrainerConfig,
        pod: PodEnv,
        launch: LaunchEnv,
        device: torch.device,
        precision: str,
        stop: boundary.StopRequest | None = None,
    ) -> None:
        self.config, self.pod, self.launch, self.device = config, pod, launch, device
        self.precision = Precision.of(device, precision)
        self.metrics = rank_metrics(config, pod, launch, device, precision)
        self.health: SyncHealth | None = None
        """Built once the model is wrapped in DDP (its first check is the initial one)."""
        self.stop = stop or boundary.StopRequest()
        """Set by SIGTERM where the caller installed it (``__main__``: once the process group formed)."""
        self.agreement = boundary.StopAgreement()  # no GPU sync per step (bench/RESULTS.md)
        self.store = checkpoints.open_store(config.checkpoint_dir) if config.checkpoint_dir else None
        """Where checkpoints live: a folder, or a bucket prefix (``s3://``); None: no checkpoints."""
        self.precision_name = precision
        self.resumed_from = 0
        self.stepped = False
        self.warm_from = ""
        self.skipped: tuple[str, ...] = ()
        self.writer: provenance.Writer | None = None
        self.state: TrainState | None = None
        self.at_boundary = False
        """Inside :meth:`on_step`: the step that raised there was completed (a heal drops none)."""
        self.healer: heal.Healer | None = None
        """This worker's heals, where its launcher heals (:func:`heal.armed_here`)."""
        self.joined: join.Joined | None = None
        """This fresh worker's state came from a live replica of a world that heals (:func:`join.join`)."""

    def build(self) -> TrainState:
        """Same-seed model, optimizer, restore (identical bytes on every rank), DDP, initial verify."""
        torch.manual_seed(self.config.seed)
        model = build_model(self.config).to(self.device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=self.config.learning_rate)
        state = TrainState(model, optimizer, self.precision.scaler())
        self.writer = self.writer_for(type(optimizer).__name__)
        # under a launcher that heals, a fresh worker first meets the world: survivors of a heal there send
        # their state (a live replica's, not the checkpoint's); none, and it restores as before heals
        self.joined = join.join(state) if heal.armed_here(os.environ) else None
        if self.joined is None:
            self.restore(state)
        else:
            self.resumed_from = state.step
        torch.manual_seed(self.config.seed + self.launch.rank)  # per-rank randomness (dropout) from here
        device_ids = [self.device] if self.device.type == "cuda" else None
        state.model = DistributedDataParallel(model, device_ids=device_ids)  # broadcasts rank 0's tensors
        self.state = state
        settings = SyncHealth.Config.from_env(  # the rest (the compute probe's) from the DDPJob's environment
            total_steps=self.config.steps,
            every=self.config.sync_every,
            # a joiner's first check only reports, as the survivors' (heal.joined refuses a mismatch)
            on_divergence="Warn" if self.joined is not None else self.config.on_divergence,
            write_report=False,  # the runner writes the report (its run() returns it)
        )
        self.health = SyncHealth(  # trust DDP's silent broadcast, then verify (the initial check)
            state.model,
            state.optimizer,
            settings,
            scaler=state.scaler,
            state=state,
            pod=self.pod,
            metrics=self.metrics,
        )
        if self.joined is not None:
            self.health.policy = self.health.verifier.policy = self.config.on_divergence
            fence = heal.checkpoint_fence(self.store, self.writer) if self.store is not None else None
            self.writer = dataclasses.replace(self.writer, world=join.joined(self.joined, self.health, fence))
        return state

    @property
    def tally(self) -> Tally:
        """The checks so far (none before the model was built)."""
        return self.health.tally if self.health is not None else Tally()

    def writer_for(self, optimizer: str) -> provenance.Writer:
        """What this run's checkpoints record: the DDPJob, the settings that shape the model, the attempt."""
        pod = self.pod
        settings = provenance.settings_of(
            self.config, self.launch.world_size, precision=self.precision_name, optimizer=optimizer
        )
        return provenance.Writer(provenance.Identity(pod.namespace, pod.job, pod.uid), settings, pod.attempt)

    def restore(self, state: TrainState) -> None:
        """Collective: load what rank 0 chose (this job's newest intact checkpoint, or a warm start's
        weights), or raise :class:`checkpoints.CheckpointRefused` on every rank."""
        assert self.writer is not None
        choice = checkpoints.restore_on_rank0(self.store, self.writer, self.config.warm_start_from)
        self.skipped = choice.skipped
        self.writer = dataclasses.replace(self.writer, world=choice.world)  # numbered by its fence
        if choice.action == "refuse":
            raise checkpoints.CheckpointRefused(choice.reason, choice.message)
        if choice.action == "resume" and choice.payload is not None:
            payload.load_into(state, choice.payload, self.device)
            self.resumed_from = choice.step
            log.info("restored %s (step %d; read by rank 0, loaded by every rank)", choice.file, choice.step)
        elif choice.action == "warm" and choice.payload is not None:
            payload.load_weights(state, choice.payload, self.device)
            self.warm_from = choice.warm_from
            log.info(
                "warm start: the model weights of %s's %s (step %d); this job starts at step 0 with a "
                "fresh optimizer",
                choice.warm_from,
                choice.file,
                choice.step,
            )
        elif self.config.warm_start_from and self.store is not None and self.launch.rank == 0:
            log.warning(
                "--warm-start-from=%s: no intact checkpoint of it in %s; starting fresh",
                self.config.warm_start_from,
                self.store.where,
            )

    def check(self, state: TrainState, kind: CheckKind) -> replicas.SyncReport:
        """A periodic or final check, with the step-time skew since the previous one."""
        assert self.health is not None and self.health.subject is state
        return self.health.check(kind)

    def on_step(self, result: StepResult) -> bool:
        """The step boundary, in this order: metrics; the fire drill; agree with the other ranks on whether
        to stop (so that a SIGTERM reaching only some ranks stops all of them at the same step); verify
        when due, applying ``--on-divergence``; save a checkpoint when due and verified. Returns whether
        to go on."""
        state, health = self.state, self.health
        assert state is not None and health is not None
        self.at_boundary = True
        health.observe(result.duration_seconds, result.samples, result.loss)
        if not self.stepped:
            self.stepped = True
            if self.launch.rank == 0:  # the recovery benchmark reads this line's timestamp
                log.info(
                    "first optimizer step of this run: step %d (resumed from %d)",
                    result.step,
                    self.resumed_from,
                )
        health.drill()
        grow = self.healer is not None and self.healer.grow_requested()
        stop, grow = self.agreement.agree(self.stop.requested, grow)
        probing = health.probe_due()  # the compute probe needs just-verified parameters: a check first
        due = boundary.due_at(
            result.step, self.config, saving=self.store is not None, stop=stop, probe=probing
        )
        if due.check is not None:
            verified = self.check(state, due.check).in_sync
            if probing and verified:
                health.run_probe()  # under onFaultyRank Fail, raises FaultyRankError naming the rank
            if due.save and verified:
                self.save(state)
        if grow and not stop:  # every rank leaves its group here, the step done (heal.Healer.heal)
            raise heal.WorldGrows(result.step)
        self.at_boundary = False
        return not stop

    def save(self, state: TrainState) -> None:
        """Rank 0 writes the checkpoint of a verified state."""
        if self.launch.rank == 0 and self.store is not None:
            assert self.writer is not None
            path = checkpoints.save(self.store, state, self.writer, self.config.checkpoint_keep)
            if path is not None:
                log.info("step %d: checkpoint saved to %s", state.step, path)

    def run(self) -> tuple[int, contract.Report]:
        """Train to the end (or until stopped); returns ``(exit code, report)``."""
        state = self.build()
        config = self.config
        self.healer = healer = heal.Healer() if heal.armed_here(os.environ) else None
        accumulation, batches = self.batches(state.step, say=self.joined is None)  # a joined world's is said
        while True:
            try:
                train(
                    state,
                    batches,
                    total_steps=config.steps,
                    grad_accumulation=accumulation,
                    precision=self.precision,
                    device=self.device,
                    loss_fn=compute_loss,
                    on_step=self.on_step,
                )
                break
            except Exception as err:
                if healer is None or not self.healed(healer, err):
                    raise
                accumulation, batches = self.batches(state.step, say=False)
        if self.tally.last_check_step != state.step:  # e.g. resumed at or past the last step
            self.check(state, "final")
        code, rep = report.finished(self.tally, self.facts(), config.steps, model_digest(state.model))
        return code, self.health.probe_summary(rep) if self.health is not None else rep

    def healed(self, healer: heal.Healer, err: Exception) -> bool:
        """Heal from ``err`` in place (:meth:`heal.Healer.heal`); whether it did (else the caller raises
        ``err``). This rank's new place, randomness, resume step and checkpoint world follow."""
        state = self.state
        assert state is not None and self.writer is not None
        fence = heal.checkpoint_fence(self.store, self.writer) if self.store is not None else None
        stopped = self.stop
        done = healer.heal(
            err,
            state,
            dropped=not self.at_boundary,
            health=self.health,
            fence=fence,
            stopped=lambda: stopped.requested,
            metrics=self.world_metrics,
        )
        if done is None:
            return False
        self.launch, self.resumed_from, self.stepped, self.at_boundary = (
            read_launch_env(os.environ),
            done.step,
            False,
            False,
        )
        self.writer = dataclasses.replace(self.writer, world=done.checkpoint_world)
        self.agreement = boundary.StopAgreement()
        heal.reseed(self.config.seed, done.rank)
        return True

    def world_metrics(self) -> TrainerMetrics:
        """This rank's series made anew for a world healed in place (its new rank and size, in the new
        world's metrics directory, which local rank 0 serves from then on): the old world's series, with
        the old ranks, are no longer served."""
        self.launch = read_launch_env(os.environ)
        directory = metrics_dir(os.environ, self.launch, anew=True)
        values.ValueClass = values.get_value_class()  # type: ignore[attr-defined,no-untyped-call]
        if self.launch.local_rank == 0:
            serve_anew(directory)
        self.metrics = rank_metrics(self.config, self.pod, self.launch, self.device, self.precision_name)
        return self.metrics

    def batches(self, step: int, say: bool = True) -> tuple[int, Batches]:
        """Micro-batches per step and the micro-batches from ``step`` on: this rank's shard, or an elastic
        job's share of the global batch at this world size (``data.elastic_batches``); ``say``: log the
        elastic world's line (a healed world's is the heal's)."""
        config, launch = self.config, self.launch
        if config.elastic_max_nodes:
            size = global_batch(config, launch.local_world_size)
            log.log(
                logging.INFO if say else logging.DEBUG,
                "%s world size %d verified at step %d, before its first step; global batch %d samples",
                contract.ELASTIC_WORLD_LOG,
                launch.world_size,
                step,
                size,
            )
            return elastic_batches(
                build_dataset(config),
                batch_size=config.batch_size,
                global_size=size,
                rank=launch.rank,
                world_size=launch.world_size,
                seed=config.seed,
                start_step=step,
            )
        return config.grad_accumulation, micro_batches(
            build_dataset(config),
            batch_size=config.batch_size,
            rank=launch.rank,
            world_size=launch.world_size,
            seed=config.seed,
            skip=step * config.grad_accumulation,
        )

    def facts(self) -> report.RunFacts:
        """What the report states beside the tally."""
        step = self.state.step if self.state is not None else 0
        restarted = self.health.restart if self.health is not None else inplace.read_state(os.environ)
        return report.RunFacts(
            step,
            self.launch.world_size,
            self.resumed_from,
            self.pod.attempt,
            self.warm_from,
            self.skipped,
            restarted.restarts,
            restarted.cause,
            restarted.restart_from,
        )

    def diverged(self, err: DivergenceError) -> tuple[int, contract.Report]:
        """The exit code and report for a divergence under ``Fail`` (or a repair that did not take)."""
        return report.diverged(self.tally, self.facts(), err.reason, str(err))

    def faulty(self, err: probe.FaultyRankError) -> tuple[int, contract.Report]:
        """The exit code and report when the compute probe named a faulty rank (``onFaultyRank: Fail``)."""
        found = err.result
        code, rep = report.faulty(found, self.tally, self.facts())
        rep["probes"] = self.health.probes if self.health is not None else 0
        return code, rep

    def refused(self, err: checkpoints.CheckpointRefused) -> tuple[int, contract.Report]:
        """The exit code and report when the checkpoint volume holds a checkpoint this run must not load."""
        return report.refused(err.reason, str(err), self.tally, self.facts())

    def failed(self, message: str) -> tuple[int, contract.Report]:
        """The exit code and report for any other error."""
        return report.failed(message, self.tally, self.facts())
