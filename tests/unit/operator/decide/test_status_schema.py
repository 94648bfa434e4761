"""Every field the status builders write survives the API server: the CRD's status schema keeps it.

The API server prunes, at every write of ``/status``, each field its structural schema does not declare
(no ``properties`` entry, no ``additionalProperties``, no ``x-kubernetes-preserve-unknown-fields`` above
it), silently: the operator reads the pruned field back as absent at its next reconcile. Here the real
decision (``decision.decide``) renders statuses that between them write every key the builders can
(decide/decision.py, decide/status.py, decide/resize.py, observe/workloads.py): a created job, a running job
read with its progress, live sync checks and a restart in place, an elastic job resizing while below its
minimum, a Kueue-queued job, a finished job with rank 0's report, a faulty rank, a preemption, a deadline;
each key path is walked down the CRD's schema from ``status``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from ddp_operator.api import crd, schema, typed_status
from ddp_operator.decide import decision
from ddp_operator.observe import live, workloads
from ddp_operator.observe.metrics import LastResize, Progress
from ddp_trainer import contract
from helpers.reconciling import NOW, ddpjob_body, job_object, observed, pod_object, reconcile_once

Status = dict[str, Any]

SYNC = {"verified": True, "checks": 7, "mismatches": 1, "repairs": 1, "lastCheckStep": 300}


def pruned(node: Mapping[str, Any], value: Any, path: str = "status") -> Iterator[str]:
    """The paths under ``path`` that the API server would prune from ``value`` under schema ``node``."""
    if isinstance(value, Mapping):
        properties = node.get("properties") or {}
        extra = node.get("additionalProperties")
        for key, item in value.items():
            if key in properties:
                yield from pruned(properties[key], item, f"{path}.{key}")
            elif isinstance(extra, Mapping):
                yield from pruned(extra, item, f"{path}.{key}")
            elif not node.get("x-kubernetes-preserve-unknown-fields"):
                yield f"{path}.{key}"
    elif isinstance(value, list) and isinstance(node.get("items"), Mapping):
        for item in value:
            yield from pruned(node["items"], item, f"{path}[]")


def paths(value: Any, path: str = "status") -> Iterator[str]:
    """Every key path in ``value`` (a list's items as ``[]``), parents before children."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield f"{path}.{key}"
            yield from paths(item, f"{path}.{key}")
    elif isinstance(value, list):
        for item in value:
            yield from paths(item, f"{path}[]")


def declared(node: Mapping[str, Any], path: str = "status") -> Iterator[str]:
    """Every field path the schema declares under ``path``."""
    for key, sub in (node.get("properties") or {}).items():
        yield f"{path}.{key}"
        yield from declared(sub, f"{path}.{key}")
    if isinstance(node.get("items"), Mapping):
        yield from declared(node["items"], f"{path}[]")


def status_schema() -> Mapping[str, Any]:
    found: Mapping[str, Any] = crd.openapi_schema()["properties"]["status"]
    return found


# -- the statuses: between them, every key a builder writes -------------------------------------------


def _pods_running(attempt: int = 1, nodes: int = 2) -> list[dict[str, Any]]:
    return [pod_object(attempt, i) for i in range(nodes)]


def _created() -> Status:
    return reconcile_once().status


def _running_read_and_restarted_in_place() -> Status:
    """Progress with every field (rates, ETA, loss, the slowest rank, a pod that did not answer), the live
    sync checks with a repair, a restart in place."""
    earlier = Progress(step=100, samples=6400.0, ranks=2, step_times={"0": (10.0, 100), "1": (12.0, 100)})
    latest = Progress(
        step=250,
        samples=16000.0,
        loss=0.25,
        ranks=2,
        step_times={"0": (25.0, 250), "1": (33.0, 250)},
        skew=0.1,
        checks_ok=2,
        checks_mismatch=1,
        repairs=1,
        last_check_ok=True,
        last_check_time=NOW.timestamp() - 5,
        last_check_step=200,
        nonfinite_steps=1,
        restarts_in_place=1,
        restart_cause="rank 1 killed by signal 9",
    )
    both = [live.Answer("job-1-0-abcde", "text"), live.Answer("job-1-1-abcde", "text")]
    first = live.record(None, 1, 9400, both, NOW.timestamp() - 30, earlier)
    one = [live.Answer("job-1-0-abcde", "text"), live.Answer("job-1-1-abcde", None, error="timed out")]
    snapshot = live.record(first, 1, 9400, one, NOW.timestamp(), latest)
    body = ddpjob_body({"phase": "Running", "attempt": 1}, trainer={"steps": 1000})
    plan = decision.decide(observed(body, [job_object(1)], _pods_running(), NOW, snapshot))
    assert plan.status["restartsInPlace"] == 1 and plan.status["progress"]["unreachable"]
    return plan.status


def _elastic_resizing_below_its_minimum() -> Status:
    """Scaled from 2 to 3 nodes (the Job resized in place) while one of its 2 pods is gone: below
    minNodes 2 since now, waiting."""
    previous = {"phase": "Running", "attempt": 1, "elastic": {"nodes": 2, "resizes": 0}}
    body = ddpjob_body(previous, nodes=3, elastic={"minNodes": 2, "maxNodes": 4})
    pods = [pod_object(1, 0), pod_object(1, 1, phase="Pending", ready=False)]
    plan = decision.decide(observed(body, [job_object(1)], pods, NOW))
    assert plan.resize_job == ("job-1", 3), plan
    assert {"belowMinSince", "lastResize"} <= set(plan.status["elastic"]), plan.status
    return plan.status


def _elastic_world_shrunk_by_a_silent_peer() -> Status:
    """Three pods ready, the trainer's world at 2 (a node went silent): ``nodes`` and ``nodesFrom`` from
    its metrics, the resize counted with its reason and the seconds it cost, healed in place: the steps it
    lost and the bytes a live replica sent."""
    previous = {
        "phase": "Running",
        "attempt": 1,
        "elastic": {"nodes": 3, "nodesFrom": "Trainer", "resizes": 0},
    }
    body = ddpjob_body(previous, nodes=3, elastic={"minNodes": 2, "maxNodes": 4})
    job = job_object(1)
    job["spec"]["completions"] = job["spec"]["parallelism"] = 3
    change = LastResize(
        contract.RESIZE_SILENT, 3, 2, NOW.timestamp() - 9.0, 7.5, 1, contract.RESIZE_HEALED, 1, 0
    )
    latest = Progress(step=40, world_size=4, resizes=1, last_resize=change, changes=(change,))
    snapshot = live.record(None, 1, 9400, [], NOW.timestamp(), latest)
    plan = decision.decide(observed(body, [job], _pods_running(nodes=3), NOW, snapshot))
    last = plan.status["elastic"]["lastResize"]
    assert (last["secondsLost"], last["stepsLost"], last["bytesSent"]) == (7.5, 1, 0), plan.status
    return plan.status


def _queued_with_kueue() -> Status:
    workload = {
        "metadata": {
            "name": "job-job-1-x",
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "job-1"}],
        },
        "status": {
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": ""},
                {"type": "Admitted", "status": "True", "reason": "Admitted", "message": ""},
            ],
            "admission": {"clusterQueue": "cluster"},
            "schedulingStats": {"evictions": [{"reason": "Preempted", "count": 1}]},
        },
    }
    body = ddpjob_body({"phase": "Pending", "attempt": 1}, queueName="team")
    queued = [job_object(1, suspend=True)]
    plan = decision.decide(observed(body, queued, [], NOW, workloads={"job-1": workloads.slim(workload)}))
    assert set(plan.status["kueue"]) == {"workload", "admitted", "clusterQueue", "evictions"}
    return plan.status


def _succeeded_with_rank0s_report() -> Status:
    report = {
        **SYNC,
        "result": "Succeeded",
        "reason": "Completed",
        "message": "300 steps",
        "step": 300,
        "resumedFromStep": 200,
        "warmStartedFrom": "ns/other",
        "skippedCheckpoints": ["step-00000300.pt: digest mismatch"],
        "probeVerdict": "agree",
        "probeWhy": "every rank computed the same gradients",
    }
    previous = {
        "phase": "Running",
        "attempt": 1,
        "progress": {"step": 280, "totalSteps": 300, "samplesPerSecond": 640.0, "eta": "3s"},
    }
    pods = [pod_object(1, 0, phase="Succeeded", exit_code=0, message=json.dumps(report))]
    plan = reconcile_once(previous, [job_object(1, condition="Complete")], pods, trainer={"steps": 300})
    assert plan.status["phase"] == "Succeeded" and plan.status["checkpoint"]["skipped"]
    return plan.status


def _faulty_rank_restarts_the_gang() -> Status:
    report = {
        **SYNC,
        "result": "Failed",
        "reason": contract.FAULTY_RANK,
        "message": "compute probe at step 2000: faulty rank 3 (pod job-1-1, node gpu-7)",
        "faultyRanks": [3],
        "faultyNodes": ["gpu-7"],
        "faultyPods": ["job-1-1"],
        "failures": [{"rank": 3, "at": NOW.timestamp() - 1, "restart": 0, "error": "RuntimeError: faulty"}],
    }
    pods = [pod_object(1, 0, exit_code=1, message=json.dumps(report)), pod_object(1, 1, exit_code=1)]
    plan = reconcile_once({"phase": "Running", "attempt": 1}, [job_object(1, condition="Failed")], pods)
    assert plan.status["lastRestart"]["kind"] == "Recreate" and plan.status["lastReport"]["failures"]
    return plan.status


def _preempted() -> Status:
    report = {**SYNC, "result": "Interrupted", "reason": "Terminated"}
    pods = [pod_object(1, 0, exit_code=143, message=json.dumps(report)), pod_object(1, 1, exit_code=143)]
    plan = reconcile_once({"phase": "Running", "attempt": 1}, [job_object(1, condition="Failed")], pods)
    assert plan.status["preemptions"] == 1
    return plan.status


def _failed_past_its_deadline() -> Status:
    previous = {"phase": "Running", "attempt": 1, "startTime": "2026-11-22T11:00:00Z"}
    later = NOW + dt.timedelta(hours=2)
    plan = reconcile_once(previous, [job_object(1)], _pods_running(), now=later, activeDeadlineSeconds=60)
    assert plan.status["phase"] == "Failed" and plan.status["completionTime"]
    return plan.status


STATUSES = {
    "created": _created,
    "running, read, restarted in place": _running_read_and_restarted_in_place,
    "elastic, resizing, below its minimum": _elastic_resizing_below_its_minimum,
    "elastic, its world shrunk by a silent peer": _elastic_world_shrunk_by_a_silent_peer,
    "queued with Kueue": _queued_with_kueue,
    "succeeded, rank 0 reporting": _succeeded_with_rank0s_report,
    "a faulty rank restarts the gang": _faulty_rank_restarts_the_gang,
    "preempted": _preempted,
    "failed past its deadline": _failed_past_its_deadline,
}


@pytest.mark.parametrize("case", sorted(STATUSES))
def test_the_crd_keeps_every_status_field_the_operator_writes(case: str) -> None:
    """What the API server would prune of the written status, by path: nothing."""
    written = STATUSES[case]()
    lost = sorted(set(pruned(status_schema(), written)))
    assert lost == [], f"{case}: the CRD's status schema would prune {lost}"


@pytest.mark.parametrize("case", sorted(STATUSES))
def test_every_written_status_is_valid_under_the_crds_schema(case: str) -> None:
    """Types and enums too: the API server refuses a status patch of the wrong type (422)."""
    assert [str(p) for p in schema.validate(status_schema(), STATUSES[case]())] == []


@pytest.mark.parametrize("case", sorted(STATUSES))
def test_every_written_status_reads_typed_and_writes_back_the_same(case: str) -> None:
    """The typed status (api/typed_status.py) holds all the builder writes: read into the dataclasses and
    written back, each status is the same mapping (the statuses above write every key between them)."""
    written = STATUSES[case]()
    assert typed_status.write(typed_status.read(written)) == written


def test_the_statuses_write_every_status_field_the_crd_declares() -> None:
    """The statuses above render every key the builders can write: each field the schema declares is
    written by one of them, so a builder's new key (added to the schema) needs a status here that writes
    it, and a declared field no builder writes any more is found."""
    written = {path for build in STATUSES.values() for path in paths(build())}
    assert sorted(set(declared(status_schema())) - written) == []


def test_a_field_missing_from_the_schema_is_named() -> None:
    """The walk can fail: what the schema does not declare is named by its path; what a map
    (additionalProperties) or x-kubernetes-preserve-unknown-fields keeps is not."""
    node = {
        "type": "object",
        "properties": {
            "kept": {"type": "object", "properties": {"a": {"type": "integer"}}},
            "items": {"type": "array", "items": {"type": "object", "properties": {"b": {"type": "string"}}}},
            "map": {"type": "object", "additionalProperties": {"type": "string"}},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
    }
    value = {
        "kept": {"a": 1, "lost": 2},
        "items": [{"b": "x", "gone": 1}],
        "map": {"any": "x"},
        "free": {"any": {"thing": 1}},
        "unknown": 1,
    }
    assert sorted(pruned(node, value)) == ["status.items[].gone", "status.kept.lost", "status.unknown"]
