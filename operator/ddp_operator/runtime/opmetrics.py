"""The operator's Prometheus metrics (``ddpjob_*``): jobs by phase, one info series per job, reconciles,
gang restarts, and an elastic job's size (the nodes training now, the desired count, resizes by reason).

No label is called ``namespace`` or ``job``: Prometheus sets those on the target (the operator's own), and
a scraped label of that name would be renamed ``exported_*``. Every label value exists from the start.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ddp_operator.api import reasons
from ddp_operator.decide.plan import Plan
from ddp_operator.decide.restarts import RESTARTS_IN_PLACE_FIELD
from ddp_operator.decide.status import PHASES, TERMINAL
from ddp_trainer import contract

JOBS_HELP = "DDPJobs this operator watches, by phase."
JOB_INFO_HELP = (
    "1 for each DDPJob this operator watches, by namespace, name and phase; gone when the DDPJob is deleted."
)
JOB_INFO_LABELS = (contract.NAMESPACE_LABEL, contract.JOB_LABEL, "phase")
"""``ddpjob_job_info`` is labelled as the trainer's series are, so a rule can join on a job's existence: an
alert about a job ends when the job is deleted (``charts/ddpjob-operator/files/alerts.yaml``)."""
SYNC_STATE_HELP = (
    "1 for each DDPJob by its SyncVerified condition's reason: BitIdentical, Diverged, NoDDPModel (no rank "
    "built a DDP model: nothing to verify), NotYetReported."
)
SYNC_STATE_LABELS = (contract.NAMESPACE_LABEL, contract.JOB_LABEL, "reason")
ELASTIC_NODES_HELP = (
    "An elastic DDPJob's world now: the nodes training (status.elastic.nodes), while it has not finished."
)
ELASTIC_DESIRED_HELP = "An elastic DDPJob's desired nodes (spec.nodes), while it has not finished."
JOB_LABELS = (contract.NAMESPACE_LABEL, contract.JOB_LABEL)
FAMILIES = (
    "ddpjob_jobs",
    "ddpjob_job_info",
    "ddpjob_sync_state",
    "ddpjob_elastic_nodes",
    "ddpjob_elastic_desired_nodes",
    "ddpjob_elastic_resizes",
    "ddpjob_reconciles",
    "ddpjob_reconcile_duration_seconds",
    "ddpjob_gang_restarts",
    "ddpjob_gang_restarts_in_place",
)
"""Every family this module exports (tests/integration/monitoring reads it: the dashboard and the alerts query
only these, and a real Prometheus scraping the operator sees each)."""
Bodies = Mapping[Any, Iterable[Mapping[str, Any]]]


class WatchedJobs(Collector):
    """``ddpjob_jobs`` (by phase) and ``ddpjob_job_info`` (one series per DDPJob), read from the operator's
    index of DDPJobs when Prometheus scrapes. Reading it on every reconcile instead cost a read of every
    DDPJob per reconcile: a fifth of the operator's time while a thousand DDPJobs were created at once."""

    def __init__(self) -> None:
        self.bodies: Bodies = {}

    def watch(self, bodies: Bodies) -> None:
        """Read ``bodies`` (Kopf's index of DDPJobs, which Kopf keeps current) at every scrape from now on."""
        self.bodies = bodies

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        jobs, info, sync, nodes, desired = families = self._families()
        counts = dict.fromkeys(PHASES, 0)
        for job in job_phases(self.bodies):
            namespace, name, phase = job.namespace, job.name, job.phase
            counts[phase] = counts.get(phase, 0) + 1
            info.add_metric([namespace, name, phase], 1)
            sync.add_metric([namespace, name, job.sync], 1)
            if job.elastic is not None and phase not in TERMINAL:
                nodes.add_metric([namespace, name], job.elastic[0])
                desired.add_metric([namespace, name], job.elastic[1])
        for phase, count in counts.items():
            jobs.add_metric([phase], count)
        return iter(families)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        return (
            GaugeMetricFamily("ddpjob_jobs", JOBS_HELP, labels=["phase"]),
            GaugeMetricFamily("ddpjob_job_info", JOB_INFO_HELP, labels=JOB_INFO_LABELS),
            GaugeMetricFamily("ddpjob_sync_state", SYNC_STATE_HELP, labels=SYNC_STATE_LABELS),
            GaugeMetricFamily("ddpjob_elastic_nodes", ELASTIC_NODES_HELP, labels=JOB_LABELS),
            GaugeMetricFamily("ddpjob_elastic_desired_nodes", ELASTIC_DESIRED_HELP, labels=JOB_LABELS),
        )


@dataclass(frozen=True)
class Watched:
    """What the metrics say of one DDPJob in the index."""

    namespace: str
    name: str
    phase: str
    sync: str
    """Its SyncVerified condition's reason."""
    elastic: tuple[int, int] | None = None
    """An elastic job's (nodes now, desired nodes)."""


def job_phases(bodies: Bodies, attempts: int = 5) -> list[Watched]:
    """What the metrics say of every DDPJob in ``bodies``. Kopf's event loop writes
    its index while a scrape (another thread) reads it: a read that saw it change ("changed size during
    iteration", or a key gone meanwhile) is read again, up to ``attempts`` reads in all."""
    for _ in range(attempts - 1):
        try:
            return _read(bodies)
        except (RuntimeError, KeyError):
            continue
    return _read(bodies)


def _read(bodies: Bodies) -> list[Watched]:
    return [
        Watched(
            body["metadata"]["namespace"],
            body["metadata"]["name"],
            _phase(body),
            _sync_reason(body),
            _size(body),
        )
        for group in list(bodies.values())
        for body in list(group)
    ]


def _size(body: Mapping[str, Any]) -> tuple[int, int] | None:
    elastic = (body.get("status") or {}).get("elastic")
    if not isinstance(elastic, Mapping):
        return None
    nodes, desired = elastic.get("nodes"), elastic.get("desired")
    return (nodes, desired) if isinstance(nodes, int) and isinstance(desired, int) else None


def _sync_reason(body: Mapping[str, Any]) -> str:
    conditions = (body.get("status") or {}).get("conditions") or []
    found = next((c for c in conditions if isinstance(c, Mapping) and c.get("type") == "SyncVerified"), None)
    return str(found.get("reason") or "NotYetReported") if found else "NotYetReported"


def _phase(body: Mapping[str, Any]) -> str:
    return str((body.get("status") or {}).get("phase") or "Pending")


WATCHED = WatchedJobs()
REGISTRY.register(WATCHED)
RECONCILES = Counter("ddpjob_reconciles", "Reconciles of one DDPJob, by result (ok, error).", ["result"])
RECONCILE_SECONDS = Histogram(
    "ddpjob_reconcile_duration_seconds",
    "Wall time of one reconcile, API calls included.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
GANG_RESTARTS = Counter(
    "ddpjob_gang_restarts", "Gang restarts started, by the DDPJob's namespace.", ["ddpjob_namespace"]
)
GANG_RESTARTS_IN_PLACE = Counter(
    "ddpjob_gang_restarts_in_place",
    "Gang restarts done in place (same pods; also counted in ddpjob_gang_restarts), by namespace.",
    ["ddpjob_namespace"],
)
ELASTIC_RESIZES = Counter(
    "ddpjob_elastic_resizes",
    "Elastic DDPJobs' worlds resized, by namespace and why: "
    + ", ".join(reasons.RESIZE_REASONS)
    + " (status.elastic.lastResize.reason).",
    ["ddpjob_namespace", "reason"],
)
RECONCILE_RESULTS = ("ok", "error")
for _result in RECONCILE_RESULTS:
    RECONCILES.labels(_result)


def serve(port: int) -> None:
    start_http_server(port)


def observe_reconcile(
    result: str, seconds: float, body: Mapping[str, Any] | None = None, plan: Plan | None = None
) -> None:
    """Count one reconcile by its ``result`` (ok, error) and time it; given the plan it carried out for
    DDPJob ``body``, the gang restarts and resizes that plan made first (:func:`observe_plan`: a plan that
    cannot be counted makes the reconcile an error). The reconcile's one entrance here."""
    try:
        if body is not None and plan is not None:
            observe_plan(body, plan)
    except Exception:
        result = "error"
        raise
    finally:
        RECONCILES.labels(result).inc()
        RECONCILE_SECONDS.observe(seconds)


def observe_plan(body: Mapping[str, Any], plan: Plan) -> None:
    """The gang restarts (in place too) and elastic resizes ``plan`` made, beyond what ``body`` said."""
    before = int((body.get("status") or {}).get("restarts") or 0)
    after = int(plan.status.get("restarts") or 0)
    if after > before:
        GANG_RESTARTS.labels(body["metadata"]["namespace"]).inc(after - before)
    before = int((body.get("status") or {}).get(RESTARTS_IN_PLACE_FIELD) or 0)
    after = int(plan.status.get(RESTARTS_IN_PLACE_FIELD) or 0)
    if after > before:
        GANG_RESTARTS_IN_PLACE.labels(body["metadata"]["namespace"]).inc(after - before)
    old = (body.get("status") or {}).get("elastic") or {}
    new = plan.status.get("elastic") or {}
    grown = int(new.get("resizes") or 0) - int(old.get("resizes") or 0)
    if grown > 0:
        reason = str((new.get("lastResize") or {}).get("reason") or reasons.SCALED)
        ELASTIC_RESIZES.labels(body["metadata"]["namespace"], reason).inc(grown)
