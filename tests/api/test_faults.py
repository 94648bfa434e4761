"""The pure parts of fault handling: a hand-edited status is repaired, a Job the API server refuses fails
the DDPJob, a stale Job kept only by pods on a lost node is let go, the node-lost tolerations, and the
transition rules that only the API server runs."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from ddp_operator import crd, reconcile, render, schema
from ddp_operator.observe import current_attempt

from .test_reconcile import NOW, _body, _job, _pod, _reconcile, _spec


def _deleting(obj: dict[str, Any], at: dt.datetime) -> dict[str, Any]:
    obj["metadata"]["deletionTimestamp"] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    return obj


@pytest.mark.parametrize(
    ("said", "jobs", "attempt"),
    [
        (None, [], 1),
        (-3, [], 1),
        ("x", [], 1),
        (4, [], 4),  # no Job left: the status is all there is
        (99, [_job(1)], 2),  # at most one beyond the newest Job
        (2, [_job(1, condition="Failed")], 2),  # Job 1 failed: the status names the next attempt
        (True, [], 1),
        (1, [_job(3)], 3),
    ],
)
def test_the_current_attempt_believes_the_status_only_as_far_as_it_can_be_true(
    said: Any, jobs: list[dict[str, Any]], attempt: int
) -> None:
    assert current_attempt({"attempt": said}, jobs) == attempt


def test_a_hand_edited_status_is_repaired_from_the_children() -> None:
    garbage = {
        "phase": "Succeeded",
        "attempt": -7,
        "restarts": -4,
        "readyNodes": 99,
        "preemptions": -2,
        "conditions": [{"type": "Bogus", "status": "True"}],
    }
    plan = _reconcile(garbage, [_job(1)], [_pod(1, 0), _pod(1, 1)])
    status = plan.status
    assert (status["phase"], status["attempt"], status["restarts"], status["readyNodes"]) == (
        "Running",
        1,
        0,
        2,
    )
    assert "preemptions" not in status and "Bogus" not in {c["type"] for c in status["conditions"]}
    assert plan.create_job is None and plan.delete_jobs == () and plan.abandon_jobs == ()


def test_a_real_finish_still_sticks() -> None:
    done = _reconcile({"attempt": 1}, [_job(1, condition="Complete")], [_pod(1, 0, phase="Succeeded")])
    assert reconcile.finished(done.status)
    again = _reconcile(done.status, [_job(1)], [_pod(1, 0)])
    assert again.status["phase"] == "Succeeded" and again.create_job is None


def test_a_refused_job_fails_the_ddpjob_and_creates_nothing() -> None:
    plan = reconcile.refused('metadata.labels: Invalid value: "a b"', {"attempt": 1}, 2, NOW)
    failed = {c["type"]: c for c in plan.status["conditions"]}["Failed"]
    assert plan.status["phase"] == "Failed" and failed["reason"] == "InvalidSpec"
    assert failed["message"].startswith("the API server refuses the Job this spec renders: metadata.labels")
    assert (plan.create_job, plan.create_service, plan.create_claim) == (None, None, None)
    assert reconcile.finished(plan.status)


def test_a_stale_job_kept_only_by_pods_past_their_deadline_is_let_go() -> None:
    deadline = NOW - dt.timedelta(seconds=reconcile.STOP_MARGIN_SECONDS + 1)
    stale = _deleting(_job(1, condition="Failed"), NOW - dt.timedelta(seconds=200))
    stuck = _deleting(_pod(1, 1), deadline)
    plan = _reconcile({"attempt": 2, "phase": "Restarting"}, [stale], [stuck])
    assert plan.delete_jobs == ("job-1",) and plan.abandon_jobs == ("job-1",)
    assert plan.create_job is None  # the next reconcile, once Job 1 is gone
    assert "NodeLost" in [e.reason for e in plan.events]


def test_a_stale_job_whose_pods_may_still_stop_is_waited_for() -> None:
    stale = _deleting(_job(1, condition="Failed"), NOW)
    soon = _deleting(_pod(1, 1), NOW + dt.timedelta(seconds=60))  # within its grace period
    late = _deleting(_pod(1, 0), NOW - dt.timedelta(seconds=5))  # past it, but within the margin
    for pods in ([soon], [late], [soon, late], [_pod(1, 0)]):
        plan = _reconcile({"attempt": 2, "phase": "Restarting"}, [stale], pods)
        assert plan.delete_jobs == ("job-1",) and plan.abandon_jobs == (), pods


def test_pods_tolerate_a_lost_node_for_node_lost_toleration_seconds() -> None:
    pod = render.render_job(_spec(), 1)["spec"]["template"]["spec"]
    lost = {t["key"]: t for t in pod["tolerations"]}
    assert set(lost) == set(render.NODE_LOST_TAINTS)
    assert {(t["effect"], t["tolerationSeconds"]) for t in lost.values()} == {("NoExecute", 30)}
    mine = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}
    pod = render.render_job(_spec(nodeLostTolerationSeconds=5, podTemplate={"tolerations": [mine]}), 1)[
        "spec"
    ]["template"]["spec"]
    assert pod["tolerations"] == [
        mine,
        {
            "key": "node.kubernetes.io/not-ready",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 5,
        },
    ]


def test_transition_rules_are_left_to_the_api_server() -> None:
    spec = crd.openapi_schema()["properties"]["spec"]
    rules = [r["rule"] for r in spec["x-kubernetes-validations"] if "oldSelf" in r["rule"]]
    assert "self.nodes == oldSelf.nodes" in rules and "self.trainer.model == oldSelf.trainer.model" in rules
    body = _body()
    assert schema.validate(crd.openapi_schema(), schema.apply_defaults(crd.openapi_schema(), body)) == []
