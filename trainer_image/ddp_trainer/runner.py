"""One trainer process from start to report: seed, build, restore, wrap in DDP, verify, train, verify.

The pieces plug into :func:`ddp_trainer.loop.train` through :meth:`Session.on_step`, which at each step
boundary, in this order: records metrics; runs the fire drill; agrees with the other ranks on whether
to stop (one 4-byte all_reduce, so that a SIGTERM reaching only some ranks still stops all of them at
the same step); verifies when due (every ``--sync-every`` steps, before a checkpoint, at the end and
when stopping), applying the ``--on-divergence`` policy; saves a checkpoint when due and verified.
"""

from __future__ import annotations

import hashlib
import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ddp_trainer import checkpoint, contract, sync
from ddp_trainer.config import PodEnv, TrainerConfig
from ddp_trainer.contract import DIVERGENCE_EXIT_CODE, INTERRUPTED_EXIT_CODE, SUCCESS_EXIT_CODE
from ddp_trainer.data import build_dataset, micro_batches
from ddp_trainer.distributed import LaunchEnv
from ddp_trainer.loop import Precision, StepResult, train
from ddp_trainer.metrics import TrainerMetrics
from ddp_trainer.model import build_model, compute_loss
from ddp_trainer.state import TrainState

log = logging.getLogger("ddp_trainer")

CHAOS_NUDGE = 1e-3


class DivergenceError(Exception):
    """The ranks hold different models and the policy says stop."""

    def __init__(self, report: sync.SyncReport, reason: str) -> None:
        super().__init__(
            f"{len(report.mismatches)} tensor(s) differ between ranks: {', '.join(report.mismatched[:5])}"
        )
        self.report = report
        self.reason = reason


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


class Session:
    """The state of one trainer process between setup and report."""

    def __init__(
        self, config: TrainerConfig, pod: PodEnv, launch: LaunchEnv, device: torch.device, precision: str
    ) -> None:
        self.config, self.pod, self.launch, self.device = config, pod, launch, device
        self.precision = Precision.of(device, precision)
        self.tally = Tally()
        self.stop_requested = False
        self.resumed_from = 0
        self.step_times: list[float] = []
        labels = {
            "job": pod.job,
            "namespace": pod.namespace,
            "rank": str(launch.rank),
            "node_rank": str(launch.node_rank),
        }
        info = {
            "world_size": str(launch.world_size),
            "device": device.type,
            "backend": dist.get_backend(),
            "precision": precision,
            "model": config.model,
            "attempt": str(pod.attempt),
            "torch_version": torch.__version__,
        }
        self.metrics = TrainerMetrics(labels, info)
        self.metrics.restarts.set(contract.restarts_before(pod.attempt) + launch.restart_count)
        self.ckpt_dir = Path(config.checkpoint_dir) if config.checkpoint_dir else None
        self.state: TrainState | None = None

    # -- setup -------------------------------------------------------------------------------------

    def build(self) -> TrainState:
        """Same-seed model, optimizer, restore (identical bytes on every rank), DDP, initial verify."""
        torch.manual_seed(self.config.seed)
        model = build_model(self.config).to(self.device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=self.config.learning_rate)
        state = TrainState(model, optimizer, self.precision.scaler())
        step, payload = checkpoint.read_latest_on_rank0(self.ckpt_dir)
        if payload is not None:
            checkpoint.load_into(state, payload, self.device)
            self.resumed_from = step
            log.info("restored the step-%d checkpoint (read by rank 0, loaded by every rank)", step)
        torch.manual_seed(self.config.seed + self.launch.rank)  # per-rank randomness (dropout) from here
        device_ids = [self.device] if self.device.type == "cuda" else None
        state.model = DistributedDataParallel(model, device_ids=device_ids)  # broadcasts rank 0's tensors
        self.state = state
        self.verify("initial")  # trust DDP's silent broadcast, then verify
        return state

    # -- verification ------------------------------------------------------------------------------

    def _extras(self, state: TrainState) -> dict[str, Any]:
        extras: dict[str, Any] = {
            "control.step": state.step,
            "control.epoch": state.epoch,
            "control.loss_scale": float(state.scaler.get_scale()) if state.scaler.is_enabled() else 1.0,
        }
        for i, group in enumerate(state.optimizer.param_groups):
            extras[f"control.lr.{i}"] = float(group["lr"])
        extras.update(sync.optimizer_state_tensors(state.optimizer, state.model))
        return extras

    def verify(self, kind: str) -> sync.SyncReport:
        """One collective check of parameters, buffers, optimizer and control state; applies the policy."""
        state = self.state
        assert state is not None
        started = time.perf_counter()
        if getattr(state.model, "broadcast_buffers", False):
            sync.broadcast_buffers_(state.model)  # what DDP does at the next forward, one step early
        report = sync.check_in_sync(state.model, extra=self._extras(state))
        duration = time.perf_counter() - started
        self.tally.checks += 1
        self.tally.last_check_step = state.step
        self.tally.last_check_ok = report.in_sync
        self.metrics.observe_check(
            kind, report.in_sync, duration, len(report.mismatches), report.max_abs_diff, time.time()
        )
        if kind in ("periodic", "final"):
            self._record_skew()
        if report.in_sync:
            log.info(
                "step %d: %s check passed (%d tensors, %.1f ms)",
                state.step,
                kind,
                report.checked,
                duration * 1e3,
            )
            return report
        self.tally.mismatches += 1
        self.tally.mismatched_tensors = list(report.mismatched)
        self.tally.diverged_ranks = list(report.ranks)
        self.tally.max_abs_diff = report.max_abs_diff
        log.error(
            "step %d: %s check FAILED: %d tensor(s) differ (%s), ranks %s, max |diff| %g",
            state.step,
            kind,
            len(report.mismatches),
            ", ".join(report.mismatched[:8]),
            list(report.ranks),
            report.max_abs_diff,
        )
        policy = self.config.on_divergence
        if policy == "Fail" or kind == "repair":
            raise DivergenceError(report, "SyncDivergence" if kind != "repair" else "RepairFailed")
        if policy == "Warn":
            return report
        return self.repair(state)

    def repair(self, state: TrainState) -> sync.SyncReport:
        """Re-broadcast model and optimizer state from rank 0, then verify again."""
        sync.broadcast_module_(state.model, src=0)
        sync.broadcast_tensors_(sync.optimizer_state_tensors(state.optimizer, state.model).values(), src=0)
        report = self.verify("repair")  # raises DivergenceError if the repair did not take
        self.tally.repairs += 1
        self.metrics.repairs.inc()
        log.warning("step %d: divergence repaired from rank 0 (repair %d)", state.step, self.tally.repairs)
        return report

    def _record_skew(self) -> None:
        """All ranks' mean step time since the last check: one all_reduce, at checks only."""
        if not self.step_times:
            return
        mean = sum(self.step_times) / len(self.step_times)
        self.step_times.clear()
        both = torch.tensor([mean, -mean], dtype=torch.float64, device=sync.comm_device(None))
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        slowest, fastest = float(both[0]), -float(both[1])
        self.metrics.skew.set((slowest - fastest) / slowest if slowest > 0 else 0.0)

    # -- the step boundary -------------------------------------------------------------------------

    def on_step(self, result: StepResult) -> bool:
        """Metrics, fire drill, stop agreement, checks, checkpoints. Returns whether to continue."""
        state = self.state
        assert state is not None
        self.metrics.observe_step(
            result.step, result.duration_seconds, result.samples, result.loss, result.finite, time.time()
        )
        self.step_times.append(result.duration_seconds)
        chaos = self.pod.chaos
        if chaos is not None and chaos.step == result.step and chaos.rank == self.launch.rank:
            self._nudge(state)
        stop = self._agree_stop()
        every = self.config.checkpoint_every
        save_due = self.ckpt_dir is not None and ((every > 0 and result.step % every == 0) or stop)
        final = result.step >= self.config.steps
        if save_due or stop or final or result.step % self.config.sync_every == 0:
            report = self.verify("final" if final or stop else "periodic")
            if save_due and report.in_sync:
                self._save(state)
        return not stop

    def _nudge(self, state: TrainState) -> None:
        name, param = sync.named_tensors(state.model, buffers=False)[0]
        with torch.no_grad():
            param.view(-1)[0] += CHAOS_NUDGE
        log.warning(
            "fire drill: rank %d nudged %s by %g at step %d", self.launch.rank, name, CHAOS_NUDGE, state.step
        )

    def _agree_stop(self) -> bool:
        flag = torch.tensor([int(self.stop_requested)], dtype=torch.int32, device=sync.comm_device(None))
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _save(self, state: TrainState) -> None:
        if self.launch.rank == 0 and self.ckpt_dir is not None:
            path = checkpoint.save(self.ckpt_dir, state, {"world_size": self.launch.world_size})
            log.info("step %d: checkpoint saved to %s", state.step, path)

    # -- the whole run -----------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT only set a flag; the ranks stop together at the next step boundary."""

        def handler(signum: int, frame: FrameType | None) -> None:
            self.stop_requested = True
            log.warning("received %s: stopping at the next step boundary", signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def run(self) -> tuple[int, dict[str, Any]]:
        """Train to the end (or until stopped); returns ``(exit code, report)``."""
        self.install_signal_handlers()
        state = self.build()
        dataset = build_dataset(self.config)
        batches = micro_batches(
            dataset,
            batch_size=self.config.batch_size,
            rank=self.launch.rank,
            world_size=self.launch.world_size,
            seed=self.config.seed,
            skip=state.step * self.config.grad_accumulation,
        )
        train(
            state,
            batches,
            total_steps=self.config.steps,
            grad_accumulation=self.config.grad_accumulation,
            precision=self.precision,
            device=self.device,
            loss_fn=compute_loss,
            on_step=self.on_step,
        )
        if self.tally.last_check_step != state.step:  # e.g. resumed at or past the last step
            self.verify("final")
        digest = hashlib.sha256(str(sync.fingerprint(state.model).tolist()).encode()).hexdigest()[:16]
        if state.step < self.config.steps:
            message = f"stopped by a signal at step {state.step} of {self.config.steps}"
            return INTERRUPTED_EXIT_CODE, self.report(
                "Interrupted", "Terminated", message, modelDigest=digest
            )
        if self.tally.verified:
            reason = "RepairedDivergence" if self.tally.repairs else "AllChecksPassed"
            message = f"{state.step} steps, {self.tally.checks} sync checks"
        else:
            reason, message = (
                "DivergenceIgnored",
                f"{self.tally.mismatches} check(s) found divergence (policy Warn)",
            )
        return SUCCESS_EXIT_CODE, self.report("Succeeded", reason, message, modelDigest=digest)

    def diverged(self, err: DivergenceError) -> tuple[int, dict[str, Any]]:
        """The exit code and report for a divergence under ``Fail`` (or a repair that did not take)."""
        return DIVERGENCE_EXIT_CODE, self.report("Diverged", err.reason, str(err))

    def report(self, result: str, reason: str, message: str, **extra: Any) -> dict[str, Any]:
        """The termination-message report (see :mod:`ddp_trainer.report`)."""
        tally = self.tally
        return {
            "result": result,
            "reason": reason,
            "message": message,
            "verified": tally.verified,
            "checks": tally.checks,
            "mismatches": tally.mismatches,
            "repairs": tally.repairs,
            "lastCheckStep": max(tally.last_check_step, 0),
            "step": self.state.step if self.state is not None else 0,
            "worldSize": self.launch.world_size,
            "mismatchedTensors": tally.mismatched_tensors,
            "divergedRanks": tally.diverged_ranks,
            "maxAbsDiff": tally.max_abs_diff,
            "resumedFromStep": self.resumed_from,
            "attempt": self.pod.attempt,
            **extra,
        }
