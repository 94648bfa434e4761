"""What a queued DDPJob says while Kueue holds its Job (observe/workloads.py), read from Workloads shaped as
Kueue v0.17 writes them (copied from the test cluster's Kueue: tests/e2e/test_kueue.py proves them there)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from ddp_operator.api.spec import parse
from ddp_operator.children import render
from ddp_operator.decide import decision, kueue
from ddp_operator.decide.plan import Plan
from ddp_operator.observe import workloads
from helpers.reconciling import observed

NOW = dt.datetime(2026, 11, 27, 3, 0, tzinfo=dt.UTC)
QUOTA = (
    "couldn't assign flavors to pod set main: "
    "insufficient unused quota for cpu in flavor default, 1 more needed"
)
PREEMPTED = (
    "Preempted to accommodate a workload (UID: 5b1, JobUID: 9c2) due to prioritization in the ClusterQueue"
)


def _workload(
    *conditions: tuple[str, str, str, str], evictions: int = 0, admitted_to: str = ""
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "conditions": [
            {"type": kind, "status": state, "reason": reason, "message": message}
            for kind, state, reason, message in conditions
        ],
        "resourceRequests": [{"name": "main", "resources": {"cpu": "1"}}],
    }
    if evictions:
        status["schedulingStats"] = {
            "evictions": [{"reason": "Preempted", "underlyingCause": "", "count": evictions}]
        }
    if admitted_to:
        status["admission"] = {
            "clusterQueue": admitted_to,
            "podSetAssignments": [{"name": "main", "count": 2}],
        }
    return {
        "metadata": {
            "name": "job-train-1-4d531",
            "uid": "w-1",
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train-1", "uid": "j-1"}],
        },
        "status": status,
    }


WAITING = _workload(("QuotaReserved", "False", "Pending", QUOTA))
ADMITTED = _workload(
    ("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue team"),
    ("Admitted", "True", "Admitted", "The workload is admitted"),
    admitted_to="team",
)
EVICTED = _workload(
    ("QuotaReserved", "False", "Pending", QUOTA),
    ("Evicted", "True", "Preempted", PREEMPTED),
    ("Admitted", "False", "NoReservation", "The workload has no reservation"),
    evictions=1,
)
NO_QUEUE = _workload(("QuotaReserved", "False", "Inadmissible", "LocalQueue nope doesn't exist"))
TIMED_OUT = _workload(
    ("Evicted", "True", "PodsReadyTimeout", "Exceeded the PodsReady timeout default/train-1"),
    evictions=1,
)


def test_a_workload_is_read_as_kueue_writes_it() -> None:
    assert workloads.owner_job(WAITING) == "train-1"
    assert (
        workloads.owner_job({"metadata": {"ownerReferences": [{"kind": "Pod", "apiVersion": "v1"}]}}) is None
    )
    waiting = workloads.read(WAITING)
    assert (waiting.admitted, waiting.pending, waiting.evicted, waiting.inadmissible) == (
        False,
        QUOTA,
        None,
        False,
    )
    admitted = workloads.read(ADMITTED)
    assert (admitted.admitted, admitted.cluster_queue, admitted.pending) == (True, "team", "")
    evicted = workloads.read(EVICTED)
    assert evicted.evicted == ("Preempted", PREEMPTED) and evicted.evictions == 1 and not evicted.admitted
    assert workloads.read(NO_QUEUE).inadmissible
    slim = workloads.slim(ADMITTED)
    assert "resourceRequests" not in slim["status"] and workloads.read(slim) == admitted


def test_the_reason_and_message_name_kueue_the_local_queue_and_kueues_words() -> None:
    assert kueue.waiting("team-q", "train-1", None)[0] == kueue.PENDING
    reason, message = kueue.waiting("team-q", "train-1", workloads.read(WAITING))
    assert (
        reason == "KueuePending"
        and "Kueue" in message
        and "LocalQueue team-q" in message
        and QUOTA in message
    )
    reason, message = kueue.waiting("team-q", "train-1", workloads.read(EVICTED))
    assert reason == "KueuePreempted" and message.startswith("preempted by Kueue: " + PREEMPTED)
    assert "admitted again" in message and QUOTA in message
    reason, message = kueue.waiting("nope", "train-1", workloads.read(NO_QUEUE))
    assert reason == "KueueInadmissible" and "LocalQueue nope doesn't exist" in message
    reason, message = kueue.waiting("team-q", "train-1", workloads.read(ADMITTED))
    assert reason == "KueueAdmitted" and "ClusterQueue team" in message
    reason, message = kueue.waiting("team-q", "train-1", workloads.read(TIMED_OUT))
    assert reason == "KueueRequeued" and "PodsReady timeout" in message
    assert {"KueueInadmissible", "KueuePreempted", "KueueRequeued", "KueueEvicted"} == kueue.WARNINGS


def _decide(previous: dict[str, Any], workload: dict[str, Any] | None, *, suspended: bool = True) -> Plan:
    body = {
        "apiVersion": "ddpjob.io/v1alpha1",
        "kind": "DDPJob",
        "metadata": {"name": "train", "namespace": "default", "uid": "u-1", "generation": 1},
        "spec": {"nodes": 2, "device": "cpu", "queueName": "team-q"},
        "status": previous,
    }
    job = render.render_job(parse(body, admitted=True), 1)
    job["spec"]["suspend"] = suspended
    workloads = {"train-1": workload} if workload is not None else None
    return decision.decide(observed(body, [job], [], NOW, workloads=workloads))


def _ready(plan: Plan) -> dict[str, Any]:
    (ready,) = [c for c in plan.status["conditions"] if c["type"] == "Ready"]
    return ready


def test_a_queued_job_says_what_kueue_says_and_a_preemption_is_no_restart() -> None:
    queued = _decide({"phase": "Pending", "attempt": 1}, WAITING)
    assert queued.status["phase"] == "Pending" and _ready(queued)["reason"] == "KueuePending"
    assert QUOTA in _ready(queued)["message"] and queued.suspend_job is None and queued.create_job is None
    assert queued.status["kueue"] == {"workload": "job-train-1-4d531", "admitted": False, "evictions": 0}
    running = _decide(queued.status, ADMITTED, suspended=False)
    assert running.status["kueue"] == {
        "workload": "job-train-1-4d531",
        "admitted": True,
        "evictions": 0,
        "clusterQueue": "team",
    }
    preempted = _decide({**running.status, "phase": "Running"}, EVICTED)
    assert preempted.status["phase"] == "Pending" and _ready(preempted)["reason"] == "KueuePreempted"
    assert [(e.type, e.reason) for e in preempted.events] == [("Warning", "KueuePreempted")]
    assert (
        preempted.status["attempt"] == 1 and preempted.status["restarts"] == 0 and not preempted.delete_jobs
    )
    assert preempted.status["kueue"]["evictions"] == 1 and "preemptions" not in preempted.status
    again = _decide(preempted.status, EVICTED)
    assert again.events == (), "a second reconcile of the same eviction posts nothing new"


def test_a_missing_local_queue_is_said_once_and_nothing_is_created_again() -> None:
    plan = _decide({"phase": "Pending", "attempt": 1}, NO_QUEUE)
    assert (
        _ready(plan)["reason"] == "KueueInadmissible"
        and "LocalQueue nope doesn't exist" in _ready(plan)["message"]
    )
    assert plan.create_job is None and plan.delete_jobs == () and plan.suspend_job is None
    assert [e.type for e in plan.events] == ["Warning"]
    assert _decide(plan.status, NO_QUEUE).events == ()
