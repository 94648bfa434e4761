"""An elastic job's rendezvous store, read from its pods (observe/store_health.py), and what the decision
makes of it: the ``RendezvousStoreReady`` condition, a Warning event once per cause when it stops serving, a
Normal one when it serves again, nothing for a rigid job (it has no store Job)."""

from __future__ import annotations

from typing import Any

from ddp_operator.api import names, reasons
from ddp_operator.children import render
from ddp_operator.decide import decision
from ddp_operator.decide.plan import Plan
from ddp_operator.observe import store_health
from ddp_operator.observe.store_health import read
from helpers.reconciling import NOW, ddpjob_body, observed, pod_object, spec_of

ELASTIC: dict[str, Any] = {"elastic": {"minNodes": 1, "maxNodes": 3}, "nodes": 3}
STORE_JOB = "job-1-rdzv"
NO_ROOM = "0/2 nodes are available: 2 Insufficient cpu."


def _store(
    name: str = "job-1-rdzv-abcde", attempt: int = 1, created: str = "2026-11-22T11:00:00Z", **pod: Any
) -> dict[str, Any]:
    """A pod of the store Job of ``attempt``, shaped as the API server returns one (``pod_object``'s)."""
    out = pod_object(attempt, 0, **pod)
    out["metadata"].update(name=name, creationTimestamp=created)
    out["metadata"]["labels"][names.STORE_LABEL] = "true"
    return out


def test_a_ready_store_pod_serves() -> None:
    found = read([_store()], 1, STORE_JOB)
    assert (found.serving, found.reason, found.fault) == (True, store_health.SERVING, False)
    assert "job-1-rdzv-abcde" in found.message


def test_no_pod_yet_is_starting_not_a_fault() -> None:
    found = read([_store(attempt=2)], 1, STORE_JOB)  # only an earlier attempt's pod is left
    assert (found.serving, found.reason, found.fault) == (False, store_health.STARTING, False)
    assert STORE_JOB in found.message and "no pod yet" in found.message


def test_an_unschedulable_store_pod_is_named_with_the_schedulers_words() -> None:
    found = read([_store(phase="Pending", ready=False, unschedulable=NO_ROOM)], 1, STORE_JOB)
    assert (found.serving, found.reason, found.fault) == (False, store_health.UNSCHEDULABLE, True)
    assert NO_ROOM in found.message and "no node can join or leave" in found.message


def test_a_store_container_that_cannot_start_quotes_the_kubelet() -> None:
    pod = _store(phase="Pending", ready=False)
    pod["status"]["containerStatuses"] = [
        {"name": "store", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}}
    ]
    found = read([pod], 1, STORE_JOB)
    assert (found.reason, found.fault) == (store_health.CANNOT_START, True)
    assert "ImagePullBackOff" in found.message and "no such image" in found.message


def test_a_store_pod_failed_or_deleted_is_lost_until_the_job_makes_another() -> None:
    failed = _store(phase="Failed", ready=False)
    failed["status"]["message"] = "Node node-1 which was running pod job-1-rdzv-abcde is unresponsive"
    found = read([failed], 1, STORE_JOB)
    assert (found.serving, found.reason, found.fault) == (False, store_health.LOST, True)
    assert "failed (Node node-1" in found.message and f"its Job {STORE_JOB} starts another" in found.message
    deleted = _store()
    deleted["metadata"]["deletionTimestamp"] = "2026-11-22T11:59:00Z"
    assert "is being deleted" in read([deleted], 1, STORE_JOB).message
    # the Job controller's replacement speaks once it exists: starting, then serving
    later = _store("job-1-rdzv-fghij", created="2026-11-22T11:59:30Z", phase="Pending", ready=False)
    replaced = read([deleted, later], 1, STORE_JOB)
    assert (replaced.reason, replaced.fault) == (store_health.LOST, True)
    assert "its replacement job-1-rdzv-fghij is starting" in replaced.message, replaced.message
    later = _store("job-1-rdzv-fghij", created="2026-11-22T11:59:30Z")
    assert read([failed, later], 1, STORE_JOB).serving


def _plan(previous: dict[str, Any], store_pods: list[dict[str, Any]], **spec: Any) -> Plan:
    job = render.render_job(spec_of(**(spec or ELASTIC)), 1)
    workers = [pod_object(1, index) for index in range(3)]
    body = ddpjob_body(previous, **(spec or ELASTIC))
    return decision.decide(observed(body, [job], workers, NOW, store_pods=store_pods))


def _store_condition(plan: Plan) -> dict[str, Any] | None:
    found = {c["type"]: c for c in plan.status["conditions"]}
    return found.get(reasons.RENDEZVOUS_STORE_READY)


RUNNING = {"phase": "Running", "attempt": 1}


def test_the_decision_writes_the_condition_and_an_event_once_per_cause() -> None:
    lost = _store(phase="Failed", ready=False)
    plan = _plan(RUNNING, [lost])
    said = _store_condition(plan)
    assert said is not None and said["status"] == "False" and said["reason"] == store_health.LOST
    assert plan.status["phase"] == reasons.RUNNING  # the world trains on without its store
    warnings = [e for e in plan.events if e.reason == store_health.LOST]
    assert len(warnings) == 1 and warnings[0].type == "Warning", plan.events
    # the next reconcile with the same cause posts nothing more, and keeps the transition time
    again = _plan({**RUNNING, "conditions": plan.status["conditions"]}, [lost])
    assert not [e for e in again.events if e.reason == store_health.LOST], again.events
    assert _store_condition(again) == said
    # the lost pod gone from the API, its replacement starting: still StoreLost (no new Warning), then
    # the replacement serves: True, and a Normal event that says so
    starting = _store("job-1-rdzv-fghij", phase="Pending", ready=False)
    later = _plan({**RUNNING, "conditions": again.status["conditions"]}, [starting])
    assert (_store_condition(later) or {}).get("reason") == store_health.LOST, later.status["conditions"]
    assert "job-1-rdzv-fghij is starting" in (_store_condition(later) or {}).get("message", "")
    assert not [e for e in later.events if e.reason in store_health.REASONS], later.events
    back = _plan({**RUNNING, "conditions": later.status["conditions"]}, [_store("job-1-rdzv-fghij")])
    assert (_store_condition(back) or {}).get("status") == "True"
    served = [e for e in back.events if e.reason == store_health.SERVING]
    assert len(served) == 1 and served[0].type == "Normal" and "serves again" in served[0].message


def test_a_store_that_starts_posts_no_event_and_a_rigid_job_has_no_condition() -> None:
    plan = _plan(RUNNING, [])
    assert (_store_condition(plan) or {}).get("reason") == store_health.STARTING
    assert not [e for e in plan.events if e.reason in store_health.REASONS], plan.events
    rigid = _plan(RUNNING, [_store(phase="Failed", ready=False)], nodes=3)
    assert _store_condition(rigid) is None
