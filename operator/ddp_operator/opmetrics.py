"""The operator's Prometheus metrics (``ddpjob_*``): jobs by phase, one info series per job, reconciles,
gang restarts.

No label is called ``namespace`` or ``job``: Prometheus sets those on the target (the operator's own), and
a scraped label of that name would be renamed ``exported_*``. Every label value exists from the start.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from ddp_trainer import contract

from .plan import Plan
from .status import PHASES

JOBS = Gauge("ddpjob_jobs", "DDPJobs this operator watches, by phase.", ["phase"])
JOB_INFO = Gauge(
    "ddpjob_job_info",
    "1 for each DDPJob this operator watches, by namespace, name and phase; gone when the DDPJob is deleted.",
    [contract.NAMESPACE_LABEL, contract.JOB_LABEL, "phase"],
)
"""Labelled as the trainer's series are, so a rule can join on a job's existence: an alert about a job
ends when the job is deleted (``charts/ddpjob-operator/files/alerts.yaml``)."""
_JOB_SERIES: set[tuple[str, str, str]] = set()
_JOB_LOCK = threading.Lock()  # reconciles run on Kopf's handler threads and on the ticker's
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
RECONCILE_RESULTS = ("ok", "error")
for _result in RECONCILE_RESULTS:
    RECONCILES.labels(_result)


def serve(port: int) -> None:
    start_http_server(port)


def observe_plan(body: Mapping[str, Any], plan: Plan) -> None:
    before = int((body.get("status") or {}).get("restarts") or 0)
    after = int(plan.status.get("restarts") or 0)
    if after > before:
        GANG_RESTARTS.labels(body["metadata"]["namespace"]).inc(after - before)
    before = int((body.get("status") or {}).get("restartsInPlace") or 0)
    after = int(plan.status.get("restartsInPlace") or 0)
    if after > before:
        GANG_RESTARTS_IN_PLACE.labels(body["metadata"]["namespace"]).inc(after - before)


def forget_job(namespace: str, name: str) -> None:
    """A DDPJob was deleted: its info series goes at once (the next reconcile may be another's, or none)."""
    with _JOB_LOCK:
        for key in [k for k in _JOB_SERIES if k[:2] == (namespace, name)]:
            _JOB_SERIES.discard(key)
            JOB_INFO.remove(*key)


def observe_reconcile(result: str, seconds: float, bodies: Mapping[Any, Iterable[Mapping[str, Any]]]) -> None:
    RECONCILES.labels(result).inc()
    RECONCILE_SECONDS.observe(seconds)
    counts = dict.fromkeys(PHASES, 0)
    series = set()
    for group in bodies.values():
        for body in group:
            phase = (body.get("status") or {}).get("phase") or "Pending"
            counts[phase] = counts.get(phase, 0) + 1
            series.add((body["metadata"]["namespace"], body["metadata"]["name"], phase))
    for phase, count in counts.items():
        JOBS.labels(phase).set(count)
    with _JOB_LOCK:
        for gone in _JOB_SERIES - series:
            JOB_INFO.remove(*gone)
        for new in series - _JOB_SERIES:
            JOB_INFO.labels(*new).set(1)
        _JOB_SERIES.clear()
        _JOB_SERIES.update(series)
