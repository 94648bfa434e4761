"""The operator's Prometheus metrics (``ddpjob_*``): jobs by phase, reconciles, gang restarts.

No label is called ``namespace`` or ``job``: Prometheus sets those on the target (the operator's own), and
a scraped label of that name would be renamed ``exported_*``. Every label value exists from the start.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from .plan import Plan
from .status import PHASES

JOBS = Gauge("ddpjob_jobs", "DDPJobs this operator watches, by phase.", ["phase"])
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


def observe_reconcile(result: str, seconds: float, bodies: Mapping[Any, Iterable[Mapping[str, Any]]]) -> None:
    RECONCILES.labels(result).inc()
    RECONCILE_SECONDS.observe(seconds)
    counts = dict.fromkeys(PHASES, 0)
    for group in bodies.values():
        for body in group:
            phase = (body.get("status") or {}).get("phase") or "Pending"
            counts[phase] = counts.get(phase, 0) + 1
    for phase, count in counts.items():
        JOBS.labels(phase).set(count)
