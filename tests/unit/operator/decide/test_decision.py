"""The pure parts of fault handling: a hand-edited status is repaired, a Job the API server refuses fails
the DDPJob, a stale Job kept only by pods on a lost node is let go, the node-lost tolerations, and the
transition rules that only the API server runs."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

import pytest

from ddp_operator.api import crd, schema
from ddp_operator.children import render
from ddp_operator.decide import decision, progress
from ddp_operator.decide.status import finished
from ddp_operator.observe import live
from ddp_operator.observe.facts import STOP_MARGIN_SECONDS, current_attempt
from ddp_operator.observe.metrics import Progress
from helpers.reconciling import NOW, ddpjob_body, job_object, observed, pod_object, reconcile_once, spec_of


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
        (99, [job_object(1)], 2),  # at most one beyond the newest Job
        (2, [job_object(1, condition="Failed")], 2),  # Job 1 failed: the status names the next attempt
        (True, [], 1),
        (1, [job_object(3)], 3),
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
    plan = reconcile_once(garbage, [job_object(1)], [pod_object(1, 0), pod_object(1, 1)])
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
    done = reconcile_once(
        {"attempt": 1}, [job_object(1, condition="Complete")], [pod_object(1, 0, phase="Succeeded")]
    )
    assert finished(done.status)
    again = reconcile_once(done.status, [job_object(1)], [pod_object(1, 0)])
    assert again.status["phase"] == "Succeeded" and again.create_job is None


def test_a_refused_job_fails_the_ddpjob_and_creates_nothing() -> None:
    said = 'the API server refuses the Job x-1 this spec renders: metadata.labels: Invalid value: "a b"'
    plan = decision.refused({"attempt": 1}, 2, NOW, said)
    failed = {c["type"]: c for c in plan.status["conditions"]}["Failed"]
    assert plan.status["phase"] == "Failed" and failed["reason"] == "InvalidSpec"
    assert failed["message"] == said
    assert (plan.create_job, plan.create_service, plan.create_claim) == (None, None, None)
    assert finished(plan.status)


def test_a_stale_job_kept_only_by_pods_past_their_deadline_is_let_go() -> None:
    deadline = NOW - dt.timedelta(seconds=STOP_MARGIN_SECONDS + 1)
    stale = _deleting(job_object(1, condition="Failed"), NOW - dt.timedelta(seconds=200))
    stuck = _deleting(pod_object(1, 1), deadline)
    plan = reconcile_once({"attempt": 2, "phase": "Restarting"}, [stale], [stuck])
    assert plan.delete_jobs == ("job-1",) and plan.abandon_jobs == ("job-1",)
    assert plan.create_job is None  # the next reconcile, once Job 1 is gone
    assert "NodeLost" in [e.reason for e in plan.events]


def test_a_stale_job_kept_by_a_pod_evicted_from_a_lost_node_is_let_go_at_once() -> None:
    stale = _deleting(job_object(1, condition="Failed"), NOW - dt.timedelta(seconds=5))
    evicted = {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}
    evicted["lastTransitionTime"] = (NOW - dt.timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    lost = _deleting(pod_object(1, 1), NOW + dt.timedelta(seconds=115))  # well within its grace period
    lost["status"]["conditions"].append(evicted)
    plan = reconcile_once({"attempt": 2, "phase": "Restarting"}, [stale], [lost])
    assert plan.delete_jobs == ("job-1",) and plan.abandon_jobs == ("job-1",)
    assert any("evicted from a lost node" in e.message for e in plan.events if e.reason == "NodeLost")
    # the same pod and another that may still stop (a node that answers): that one is waited for
    other = _deleting(pod_object(1, 0), NOW + dt.timedelta(seconds=115))
    plan = reconcile_once({"attempt": 2, "phase": "Restarting"}, [stale], [lost, other])
    assert plan.delete_jobs == ("job-1",) and plan.abandon_jobs == ()


def test_a_stale_job_whose_pods_may_still_stop_is_waited_for() -> None:
    stale = _deleting(job_object(1, condition="Failed"), NOW)
    soon = _deleting(pod_object(1, 1), NOW + dt.timedelta(seconds=60))  # within its grace period
    late = _deleting(pod_object(1, 0), NOW - dt.timedelta(seconds=5))  # past it, but within the margin
    for pods in ([soon], [late], [soon, late], [pod_object(1, 0)]):
        plan = reconcile_once({"attempt": 2, "phase": "Restarting"}, [stale], pods)
        assert plan.delete_jobs == ("job-1",) and plan.abandon_jobs == (), pods


def test_pods_tolerate_a_lost_node_for_node_lost_toleration_seconds() -> None:
    pod = render.render_job(spec_of(), 1)["spec"]["template"]["spec"]
    lost = {t["key"]: t for t in pod["tolerations"]}
    assert set(lost) == set(render.NODE_LOST_TAINTS)
    assert {(t["effect"], t["tolerationSeconds"]) for t in lost.values()} == {("NoExecute", 30)}
    mine = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}
    pod = render.render_job(spec_of(nodeLostTolerationSeconds=5, podTemplate={"tolerations": [mine]}), 1)[
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
    assert (
        "self.nodes == oldSelf.nodes || has(self.elastic)" in rules
        and "self.trainer.model == oldSelf.trainer.model" in rules
    )
    body = ddpjob_body()
    assert schema.validate(crd.openapi_schema(), schema.apply_defaults(crd.openapi_schema(), body)) == []


def _reading(step: int, step_times: dict[str, tuple[float, float]] | None = None) -> Progress:
    return Progress(step=step, samples=32.0 * step, ranks=2, step_times=step_times or {})


def _answers(*pods: str, hung: str | None = None) -> list[live.Answer]:
    answers = [live.Answer(pod, "ddp_step 1\n") for pod in pods]
    return answers + ([live.Answer(hung, None, error="timed out")] if hung else [])


def test_a_reading_remembers_when_rank_0_last_stepped() -> None:
    snap = live.record(None, 1, 9400, _answers("a", "b"), 1000.0, _reading(0))
    assert (snap.best_step, snap.advanced_at) == (0, 0.0)
    snap = live.record(snap, 1, 9400, _answers("a", "b"), 1010.0, _reading(50))
    assert (snap.best_step, snap.advanced_at) == (50, 1010.0)
    snap = live.record(snap, 1, 9400, _answers("a", hung="b"), 1020.0, _reading(51))
    snap = live.record(snap, 1, 9400, _answers("a", hung="b"), 1030.0, _reading(51))
    snap = live.record(snap, 1, 9400, [live.Answer("a", None, error="timed out")], 1040.0, None)
    assert (snap.best_step, snap.advanced_at) == (51, 1020.0)
    other = live.record(snap, 2, 9400, _answers("a", "b"), 1050.0, _reading(0))
    assert (other.best_step, other.advanced_at) == (0, 0.0)


def test_a_stall_names_the_pod_that_stopped_answering_and_the_ranks_behind() -> None:
    times = {"0": (5.0, 50.0), "1": (5.0, 50.0), "2": (4.0, 40.0), "3": (5.0, 50.0)}
    snap = live.record(None, 1, 9400, _answers("a", "b"), 1000.0, _reading(50, times))
    for at in (1010.0, 1019.0):
        snap = live.record(snap, 1, 9400, _answers("a", hung="job-1-1-xyz"), at, _reading(50, times))
        assert progress.stalled(snap, 1, 20) is None
    snap = live.record(snap, 1, 9400, _answers("a", hung="job-1-1-xyz"), 1020.0, _reading(50, times))
    why = progress.stalled(snap, 1, 20)
    assert why is not None and why.startswith(
        "no optimizer step for 20s (rank 0 at step 50; the limit is 20s"
    )
    assert "pod job-1-1-xyz did not answer its metrics (timed out)" in why
    assert "rank 2 is at step 40 of 50" in why and "rank 1 " not in why
    assert progress.stalled(snap, 1, 0) is None and progress.stalled(snap, 2, 20) is None


def test_a_slow_model_gets_twenty_step_times() -> None:
    snap = live.record(None, 1, 9400, _answers("a"), 1000.0, _reading(5, {"0": (50.0, 5.0)}))  # 10 s/step
    snap = live.record(snap, 1, 9400, _answers("a"), 1150.0, _reading(5, {"0": (50.0, 5.0)}))
    assert progress.limit_seconds(snap, 20) == 200.0 and progress.stalled(snap, 1, 20) is None


def test_a_stalled_attempt_restarts_the_gang_and_its_job_goes() -> None:
    snap = live.record(None, 1, 9400, _answers("a"), NOW.timestamp() - 700, _reading(50))
    snap = live.record(snap, 1, 9400, _answers("a", hung="job-1-1-xyz"), NOW.timestamp(), _reading(50))
    body = ddpjob_body({"phase": "Running", "attempt": 1})
    plan = decision.decide(observed(body, [job_object(1)], [pod_object(1, 0), pod_object(1, 1)], NOW, snap))
    assert plan.status["attempt"] == 2 and plan.status["phase"] == "Restarting"
    ready = {c["type"]: c for c in plan.status["conditions"]}["Ready"]
    assert ready["reason"] == "Stalled" and "job-1-1-xyz" in ready["message"]
    assert "gang restart 1 of 2" in ready["message"] and plan.delete_jobs == ("job-1",)
    body = ddpjob_body({"phase": "Running", "attempt": 3})
    spent = decision.decide(
        observed(body, [job_object(3)], [pod_object(3, 0), pod_object(3, 1)], NOW, replace(snap, attempt=3))
    )
    assert spent.status["phase"] == "Failed" and spent.delete_jobs == ("job-3",)


def test_a_gang_that_never_steps_is_stalled_naming_the_pod_and_ranks_that_did_not_arrive() -> None:
    refused = [live.Answer("job-1-0-abc", "ddp_step 0\n"), live.Answer("job-1-1-xyz", None, refused=True)]
    times = {"0": (0.0, 0.0), "1": (0.0, 0.0)}
    snap = live.record(None, 1, 9400, refused, 1000.0, _reading(0, times))
    assert progress.never_started(snap, 1, 899.0, 900, 4, built_in=True) is None  # not yet
    why = progress.never_started(snap, 1, 900.0, 900, 4, built_in=True)
    assert why is not None and why.startswith("no first optimizer step 900s after every pod was running")
    assert "spec.startTimeoutSeconds" in why and "pod job-1-1-xyz has no trainer answering" in why
    assert "rank(s) 2, 3 never reported (seen: 0, 1)" in why
    assert progress.never_started(snap, 1, 900.0, 0, 4, built_in=True) is None  # 0 turns it off
    stepped = live.record(snap, 1, 9400, refused, 1010.0, _reading(1, times))
    assert progress.never_started(stepped, 1, 2000.0, 900, 4, built_in=True) is None
    silent = live.record(None, 1, 9400, [live.Answer("a", None, refused=True)], 1000.0, None)
    assert progress.never_started(silent, 1, 2000.0, 900, 4, built_in=False) is None  # no metrics: not judged
    assert "the gang never formed" in (progress.never_started(silent, 1, 2000.0, 900, 4, built_in=True) or "")


def test_a_gang_that_never_steps_ends_its_attempt_as_stalled() -> None:
    silent = [live.Answer("job-1-0-abc", None, refused=True), live.Answer("job-1-1-xyz", None, refused=True)]
    snap = live.record(None, 1, 9400, silent, NOW.timestamp(), None)
    ready_since = (NOW - dt.timedelta(seconds=61)).strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = {"type": "Ready", "status": "True", "reason": "AllNodesReady", "lastTransitionTime": ready_since}
    body = ddpjob_body({"phase": "Running", "attempt": 1, "conditions": [ready]}, startTimeoutSeconds=60)
    plan = decision.decide(observed(body, [job_object(1)], [pod_object(1, 0), pod_object(1, 1)], NOW, snap))
    said = {c["type"]: c for c in plan.status["conditions"]}["Ready"]
    assert said["reason"] == "Stalled" and "job-1-1-xyz" in said["message"], said
    assert plan.status["attempt"] == 2 and plan.delete_jobs == ("job-1",)


def test_a_failed_attempt_does_not_wait_for_a_pod_evicted_from_a_lost_node() -> None:
    lost = pod_object(1, 1)
    lost["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}
    )
    failed = job_object(1, condition="Failed", reason="BackoffLimitExceeded")
    failed["status"]["conditions"][0]["lastTransitionTime"] = "2026-11-22T11:59:50Z"
    crashed = pod_object(1, 0, phase="Failed", exit_code=1)
    plan = reconcile_once({"phase": "Running", "attempt": 1}, [failed], [crashed, lost])
    assert plan.status["attempt"] == 2 and plan.delete_jobs == ("job-1",), plan.status
    waiting = reconcile_once({"phase": "Running", "attempt": 1}, [failed], [crashed, pod_object(1, 1)])
    assert waiting.status["attempt"] == 1 and waiting.delete_jobs == ()


def test_a_job_the_controller_marked_failure_target_has_failed() -> None:
    """Kubernetes adds Failed only once every pod terminated; FailureTarget says so at once."""
    target = job_object(1, condition="FailureTarget", reason="BackoffLimitExceeded")
    crashed = pod_object(1, 0, phase="Failed", exit_code=1)
    plan = reconcile_once({"phase": "Running", "attempt": 1}, [target], [crashed, pod_object(1, 1)], NOW)
    assert plan.status["phase"] == "Restarting" and plan.status["attempt"] == 1  # waits for pod 1 first
    later = NOW + dt.timedelta(seconds=render.TERMINATION_GRACE_SECONDS + STOP_MARGIN_SECONDS + 1)
    target["status"]["conditions"][0]["lastTransitionTime"] = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
    plan = reconcile_once({"phase": "Running", "attempt": 1}, [target], [crashed, pod_object(1, 1)], later)
    assert plan.status["attempt"] == 2 and plan.delete_jobs == ("job-1",)


def test_why_the_gang_restarts_stays_said_while_the_old_pods_go() -> None:
    snap = live.record(None, 1, 9400, _answers("a"), NOW.timestamp() - 700, _reading(50))
    snap = live.record(snap, 1, 9400, _answers("a", hung="job-1-1-xyz"), NOW.timestamp(), _reading(50))
    decided = decision.decide(
        observed(
            ddpjob_body({"phase": "Running", "attempt": 1}),
            [job_object(1)],
            [pod_object(1, 0), pod_object(1, 1)],
            NOW,
            snap,
        )
    )
    going = _deleting(job_object(1), NOW)
    later = reconcile_once(decided.status, [going], [pod_object(1, 0)], NOW + dt.timedelta(seconds=5))
    ready = {c["type"]: c for c in later.status["conditions"]}["Ready"]
    assert (
        later.status["phase"] == "Restarting"
        and ready["reason"] == "Stalled"
        and "job-1-1-xyz" in ready["message"]
    )
    assert later.events == () and later.delete_jobs == ("job-1",)
