"""Prometheus metrics of the trainer: the ``ddp_*`` family (names in ``ddp_trainer.contract``).

Every series carries ``ddpjob`` (the DDPJob's name), ``ddpjob_namespace``, ``rank`` (global) and
``node_rank`` (:data:`ddp_trainer.contract.METRIC_LABELS`: not ``job``/``namespace``, which Prometheus
owns), and every label combination exists from the start, at 0. One scrape port per
pod shows every local rank: each rank process writes its values to memory-mapped files in
``PROMETHEUS_MULTIPROC_DIR`` (prometheus-client's multiprocess mode, prepared by
:func:`ddp_trainer.core.distributed.metrics_dir` before this module is imported) and local rank 0 serves
them all on ``DDPJOB_METRICS_PORT``. Gauges use the ``mostrecent`` mode: series are per rank anyway, and
a restarted rank's value replaces the dead process's.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ddp_trainer import contract
from ddp_trainer.core.inplace import LaunchState

LABELS = contract.METRIC_LABELS
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CHECK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class TrainerMetrics:
    """This rank's series. ``registry=None`` (multiprocess mode) registers nothing in-process."""

    def __init__(
        self, labels: dict[str, str], info: dict[str, str], registry: CollectorRegistry | None = None
    ) -> None:
        assert set(labels) == set(LABELS), labels
        self.labels = labels

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, LABELS + extra, registry=registry, multiprocess_mode="mostrecent")

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, LABELS + extra, registry=registry)

        self.info = dict(info)
        """The rank's description now (the labels of its ``ddp_info`` series at 1)."""
        self._info = gauge(
            contract.INFO, "1; labels describe the rank (0: a replaced description).", tuple(sorted(info))
        )
        self._info.labels(**labels, **info).set(1)
        self.step = gauge(contract.STEP, "The optimizer step this rank finished last.").labels(**labels)
        self.last_check = gauge(
            contract.SYNC_LAST_CHECK_TIMESTAMP, "Unix time of the last sync check, passed or not."
        ).labels(**labels)
        self.last_check_ok = gauge(
            contract.SYNC_LAST_CHECK_OK, "1 if the last sync check found every rank bit-identical, else 0."
        ).labels(**labels)
        self.last_check_step = gauge(
            contract.SYNC_LAST_CHECK_STEP, "The optimizer step at which the last sync check ran."
        ).labels(**labels)
        self.sync_every = gauge(
            contract.SYNC_EVERY_STEPS, "Steps between periodic sync checks (the job's syncCheck.everySteps)."
        ).labels(**labels)
        self.total_steps = gauge(
            contract.TOTAL_STEPS, "The run's total optimizer steps where known, else 0."
        ).labels(**labels)
        self.steps = counter(contract.STEPS, "Optimizer steps done by this rank.").labels(**labels)
        self.step_duration = Histogram(
            contract.STEP_DURATION,
            "Wall time of one optimizer step.",
            LABELS,
            registry=registry,
            buckets=STEP_BUCKETS,
        ).labels(**labels)
        self.samples = counter(contract.SAMPLES, "Samples consumed by this rank.").labels(**labels)
        self.loss = gauge(contract.LOSS, "Loss of this rank's last step.").labels(**labels)
        self.checks = counter(
            contract.SYNC_CHECKS,
            "Sync checks by kind (initial, periodic, final, repair) and result.",
            ("kind", "result"),
        )
        for kind in contract.CHECK_KINDS:
            for result in contract.CHECK_RESULTS:
                self.checks.labels(**labels, kind=kind, result=result)
        self.check_duration = Histogram(
            contract.SYNC_CHECK_DURATION,
            "Wall time of one sync check.",
            LABELS,
            registry=registry,
            buckets=CHECK_BUCKETS,
        ).labels(**labels)
        self.mismatched = gauge(
            contract.SYNC_MISMATCHED_TENSORS, "Tensors that differed at the last check."
        ).labels(**labels)
        self.max_abs = gauge(
            contract.SYNC_MAX_ABS_DIVERGENCE, "Largest absolute difference between ranks at the last check."
        ).labels(**labels)
        self.rank_diverged = gauge(
            contract.SYNC_RANK_DIVERGED, "1 while the last check named this rank diverged, else 0."
        ).labels(**labels)
        self.repairs = counter(
            contract.SYNC_REPAIRS, "Divergences repaired by re-broadcasting from rank 0."
        ).labels(**labels)
        self.last_success = gauge(
            contract.SYNC_LAST_SUCCESS_TIMESTAMP, "Unix time of the last check that passed."
        ).labels(**labels)
        self.last_step = gauge(contract.LAST_STEP_TIMESTAMP, "Unix time of the last finished step.").labels(
            **labels
        )
        self.skew = gauge(
            contract.STEP_TIME_SKEW, "(slowest - fastest) / slowest mean step time between checks, 0-1."
        ).labels(**labels)
        self.nonfinite = counter(
            contract.NONFINITE_LOSS_STEPS, "Steps whose loss was NaN or infinite."
        ).labels(**labels)
        self.restarts = gauge(
            contract.RESTARTS, "Restarts before this run: gang attempts + gang restarts in place."
        ).labels(**labels)
        self.restarts_in_place = gauge(
            contract.RESTARTS_IN_PLACE, "Gang restarts done in place (same pods) in this attempt."
        ).labels(**labels)
        self._last_restart = gauge(
            contract.LAST_RESTART_INFO,
            "The last in-place gang restart (value), its cause and where its workers' state came from.",
            ("cause", contract.RESTART_FROM_LABEL),
        )
        self.resizes = gauge(
            contract.ELASTIC_RESIZES,
            "An elastic job's world changes this pod's launcher saw in this attempt.",
        ).labels(**labels)
        self._resize = gauge(
            contract.RESIZE_INFO,
            "Each world change this pod's launcher saw (why, nodes before and after, the round it formed "
            "in); value: when the world before stopped.",
            ("reason", "from_nodes", "to_nodes", "round", "mode"),
        )
        self.resize_lost = gauge(
            contract.LAST_RESIZE_SECONDS_LOST,
            "Seconds from the earlier world's stop to this world verified, before its first step.",
        ).labels(**labels)
        # a healed world's only (no series until healed(): a restarted world's would read 0, not absent)
        self._heal_lost = gauge(
            contract.LAST_RESIZE_STEPS_LOST, "A world healed in place: steps its survivors trained, lost."
        )
        self._heal_sent = gauge(
            contract.LAST_RESIZE_BYTES_SENT, "A world healed in place: bytes of state a live replica sent."
        )
        self._registry = registry
        self.probe: ProbeSeries | None = None

    def restarted(self, count: int, cause: str, source: str = contract.RESTART_FROM_CHECKPOINT) -> None:
        """This attempt's in-place gang restarts so far, why the last one happened, and where its workers'
        state came from (``source``: one of ``contract.RESTART_FROM``)."""
        self.restarts_in_place.set(count)
        if count:
            where = {contract.RESTART_FROM_LABEL: source}
            self._last_restart.labels(**self.labels, cause=cause, **where).set(count)

    def resized(self, state: LaunchState, now: float) -> None:
        """An elastic job's world changes in this attempt, as this pod's launcher saw them, each: why, the
        nodes before and after, the round it formed in, when the earlier world stopped; and the seconds from
        the last one's stop to ``now`` (this world verified, before its first step). Nothing before the
        first change."""
        if not state.resizes:
            return
        self.resizes.set(state.resizes)
        for change in state.history:
            labels = {
                "reason": change.reason,
                "from_nodes": str(change.before),
                "to_nodes": str(change.after),
                "round": str(change.round),
                "mode": change.mode,
            }
            self._resize.labels(**self.labels, **labels).set(change.at)
        self.resize_lost.set(max(0.0, now - state.resize_at))

    def healed(self, lost: int, sent: int) -> None:
        """What the heal that made this world cost: steps lost and bytes of state sent."""
        self._heal_lost.labels(**self.labels).set(lost)
        self._heal_sent.labels(**self.labels).set(sent)

    def start_probe(self, every: int, node: str, pod: str) -> ProbeSeries:
        """The ``ddp_probe_*`` series of this rank, at 0 (only when the compute probe is on)."""
        self.probe = ProbeSeries(self.labels, every, node, pod, self._registry)
        return self.probe

    def describe(self, **changes: str) -> None:
        """Change labels of the description (``fingerprint`` after a kernel fell back): the new series of
        ``ddp_info`` is 1 and the replaced one 0 (the multiprocess files keep every series they saw)."""
        new = self.info | changes
        assert set(new) == set(self.info), changes
        if new != self.info:
            self._info.labels(**self.labels, **self.info).set(0)
            self._info.labels(**self.labels, **new).set(1)
            self.info = new

    def observe_step(
        self, step: int, duration_seconds: float, samples: int, loss: float | None, finite: bool, now: float
    ) -> None:
        """Record one finished step (``loss`` None: not known, the gauge keeps its value)."""
        self.steps.inc()
        self.step.set(step)
        self.step_duration.observe(duration_seconds)
        self.samples.inc(samples)
        if loss is None:
            pass
        elif finite:
            self.loss.set(loss)
        else:
            self.nonfinite.inc()
        self.last_step.set(now)

    def observe_check(
        self,
        kind: str,
        step: int,
        in_sync: bool,
        duration_seconds: float,
        mismatched: int,
        max_abs: float,
        now: float,
        diverged_ranks: tuple[int, ...] = (),
    ) -> None:
        """Record one sync check (``diverged_ranks``: the ranks whose copy it found different)."""
        self.checks.labels(
            **self.labels,
            kind=kind,
            result=contract.CHECK_RESULT_OK if in_sync else contract.CHECK_RESULT_MISMATCH,
        ).inc()
        self.check_duration.observe(duration_seconds)
        self.mismatched.set(mismatched)
        self.max_abs.set(max_abs)
        self.rank_diverged.set(1 if int(self.labels[contract.RANK_LABEL]) in diverged_ranks else 0)
        self.last_check.set(now)
        self.last_check_ok.set(1 if in_sync else 0)
        self.last_check_step.set(step)
        if in_sync:
            self.last_success.set(now)


class ProbeSeries:
    """The compute probe's series of one rank: runs by result, the last verdict on this rank (``faulty``
    and ``flaky`` carry the rank's ``node`` and ``pod_name``, so an alert can say where), the duration."""

    def __init__(
        self, labels: dict[str, str], every: int, node: str, pod: str, registry: CollectorRegistry | None
    ) -> None:
        where = {contract.NODE_LABEL: node, contract.POD_LABEL: pod}
        extra = tuple(where)
        self.runs = Counter(
            contract.PROBES, "Compute probes by result.", (*LABELS, "result"), registry=registry
        )
        for result in contract.PROBE_RESULTS:
            self.runs.labels(**labels, result=result)
        self.labels = labels
        self.faulty = Gauge(
            contract.PROBE_FAULTY,
            "1 if the last compute probe named this rank faulty (its gradients differ from its peers').",
            LABELS + extra,
            registry=registry,
            multiprocess_mode="mostrecent",
        ).labels(**labels, **where)
        self.flaky = Gauge(
            contract.PROBE_FLAKY,
            "1 if the last compute probe named this rank flaky (it did not reproduce its own result).",
            LABELS + extra,
            registry=registry,
            multiprocess_mode="mostrecent",
        ).labels(**labels, **where)
        self.duration = Histogram(
            contract.PROBE_DURATION,
            "Wall time of one compute probe.",
            LABELS,
            registry=registry,
            buckets=CHECK_BUCKETS,
        ).labels(**labels)
        self.last = Gauge(
            contract.PROBE_LAST_TIMESTAMP,
            "Unix time of the last compute probe.",
            LABELS,
            registry=registry,
            multiprocess_mode="mostrecent",
        ).labels(**labels)
        Gauge(
            contract.PROBE_EVERY_STEPS,
            "Steps between compute probes (the job's syncCheck.probeEverySteps).",
            LABELS,
            registry=registry,
            multiprocess_mode="mostrecent",
        ).labels(**labels).set(every)
        self.faulty.set(0)
        self.flaky.set(0)

    def observe(self, result: str, this_rank_named: bool, seconds: float, now: float) -> None:
        """Record one probe: its result, whether it named this rank, how long it took."""
        self.runs.labels(**self.labels, result=result).inc()
        self.faulty.set(1 if this_rank_named and result == "faulty" else 0)
        self.flaky.set(1 if this_rank_named and result == "flaky" else 0)
        self.duration.observe(seconds)
        self.last.set(now)
