"""decision.decide: every branch, from fabricated Jobs and pods shaped like the API server's."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from ddp_operator.children import render
from ddp_operator.decide import decision, status
from ddp_operator.decide.plan import Plan
from ddp_operator.observe import claims, live
from ddp_operator.observe.metrics import Progress
from ddp_operator.runtime import recent, reconcile
from ddp_operator.runtime.recent import Recent
from ddp_trainer import contract
from helpers.kubelet_pods import MOUNT_NOT_FOUND, NOT_FOUND, failed_mount, kubelet_pod, mounting_pod
from helpers.reconciling import NOW, ddpjob_body, job_object, observed, pod_object, reconcile_once, spec_of

REPORT = {
    "result": "Succeeded",
    "verified": True,
    "checks": 7,
    "mismatches": 0,
    "repairs": 0,
    "lastCheckStep": 300,
}


def _conditions(plan: Plan) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in plan.status["conditions"]}


def test_new_job_creates_attempt_one() -> None:
    plan = reconcile_once()
    assert plan.create_job is not None and plan.create_job["metadata"]["name"] == "job-1"
    assert plan.create_service is not None and plan.create_service["spec"]["clusterIP"] == "None"
    assert plan.status["phase"] == "Pending" and plan.status["attempt"] == 1 and plan.status["restarts"] == 0
    assert plan.status["observedGeneration"] == 3 and plan.status["startTime"] == "2026-11-22T12:00:00Z"
    assert [e.reason for e in plan.events] == ["Created"]


def test_running_when_every_pod_is_ready() -> None:
    plan = reconcile_once(
        {"phase": "Pending", "attempt": 1}, [job_object(1)], [pod_object(1, 0), pod_object(1, 1)]
    )
    assert plan.status["phase"] == "Running" and plan.status["readyNodes"] == 2
    assert _conditions(plan)["Ready"] == ("True", "AllNodesReady")
    assert plan.create_job is None and plan.delete_jobs == ()


def test_unschedulable_is_explained() -> None:
    why = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    plan = reconcile_once(
        {"phase": "Pending"},
        [job_object(1)],
        [pod_object(1, 0), pod_object(1, 1, phase="Pending", unschedulable=why)],
    )
    assert plan.status["phase"] == "Pending" and plan.status["readyNodes"] == 1
    assert _conditions(plan)["Ready"] == ("False", "Unschedulable")
    assert any(e.type == "Warning" and why in e.message for e in plan.events)


def test_a_claim_that_cannot_bind_is_diagnosed_in_ready_and_an_event_once() -> None:
    why = "0/2 nodes are available: pod has unbound immediate PersistentVolumeClaims. not found"
    claim = {"spec": {"accessModes": ["ReadWriteOnce"]}, "status": {"phase": "Pending"}}
    reading = claims.ClaimReading("job-checkpoints", claim, ())
    pods = [pod_object(1, i, phase="Pending", unschedulable=why) for i in range(2)]
    body = ddpjob_body(
        {"phase": "Pending", "attempt": 1}, checkpoint={"volumeClaimTemplate": {"size": "1Gi"}}
    )
    plan = decision.decide(observed(body, [job_object(1)], pods, NOW, None, reading))
    ready = {c["type"]: c for c in plan.status["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "NoStorageClass")
    assert "job-checkpoints" in ready["message"] and "no default one" in ready["message"]
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "NoStorageClass")]
    assert "job-checkpoints" in plan.events[0].message
    again = decision.decide(
        observed({**body, "status": plan.status}, [job_object(1)], pods, NOW, None, reading)
    )
    assert again.events == ()  # said once, while the cause holds
    # without a reading (the claim not read), the scheduler's message is all there is
    plain = decision.decide(observed(body, [job_object(1)], pods, NOW))
    assert _conditions(plain)["Ready"] == ("False", "Unschedulable")


def test_a_missing_secret_is_named_in_ready_once_and_spends_no_restart() -> None:
    """The kubelet's CreateContainerConfigError: Pending with reason ConfigError, the pod, the container
    and the kubelet's words in Ready, one Warning event; past startTimeoutSeconds nothing is restarted,
    and once the Secret exists the pods start and the job runs."""
    missing = ("CreateContainerConfigError", 'secret "s3-creds" not found')
    pods = [kubelet_pod(0, waiting=missing), kubelet_pod(1, waiting=missing)]
    body = ddpjob_body({"phase": "Pending", "attempt": 1}, envFrom=[{"secretRef": {"name": "s3-creds"}}])
    body["spec"]["startTimeoutSeconds"] = 60
    plan = decision.decide(observed(body, [job_object(1)], pods, NOW))
    ready = {c["type"]: c for c in plan.status["conditions"]}["Ready"]
    assert plan.status["phase"] == "Pending"
    assert (ready["status"], ready["reason"]) == ("False", "ConfigError")
    assert ready["message"].startswith(
        '0/2 pods ready; pod job-1-0-x7k2p container trainer: CreateContainerConfigError: secret "s3-creds" '
        "not found; it will not fix itself: create Secret s3-creds (spec.envFrom[0].secretRef) in namespace "
        "team-a"
    )
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "ConfigError")]
    assert "spec.envFrom[0].secretRef" in plan.events[0].message
    later = NOW + dt.timedelta(hours=2)
    again = decision.decide(observed({**body, "status": plan.status}, [job_object(1)], pods, later))
    assert again.events == () and again.status == plan.status  # said once; nothing new to write
    assert again.delete_jobs == () and again.create_job is None  # no restart spent, no new gang
    assert (again.status["attempt"], again.status["restarts"]) == (1, 0)
    pods = [pod_object(1, 0), pod_object(1, 1)]  # the Secret was created: the kubelet starts the containers
    started = decision.decide(observed({**body, "status": again.status}, [job_object(1)], pods, later))
    assert started.status["phase"] == "Running" and _conditions(started)["Ready"] == ("True", "AllNodesReady")


def test_a_failing_pull_is_one_cause_while_the_kubelet_alternates_its_reasons() -> None:
    """ErrImagePull, then ImagePullBackOff, then ErrImagePull again as the kubelet retries: the REASON
    column follows the kubelet, the event is posted once; another cause is another event."""
    body = ddpjob_body({"phase": "Pending", "attempt": 1})
    said = []
    for waiting in (
        ("ErrImagePull", NOT_FOUND),
        ("ImagePullBackOff", 'Back-off pulling image "ddpjob/traner:0.1.0"'),
        ("ErrImagePull", NOT_FOUND),
        ("CreateContainerConfigError", 'configmap "settings" not found'),
    ):
        plan = decision.decide(
            observed(body, [job_object(1)], [kubelet_pod(0, waiting=waiting), kubelet_pod(1)], NOW)
        )
        assert plan.status["phase"] == "Pending" and plan.delete_jobs == ()
        ready = {c["type"]: c for c in plan.status["conditions"]}["Ready"]
        assert ready["reason"] == {"CreateContainerConfigError": "ConfigError"}.get(waiting[0], waiting[0])
        assert waiting[1] in ready["message"] and "pod job-1-0-x7k2p container trainer" in ready["message"]
        said += [(e.type, e.reason) for e in plan.events]
        body = {**body, "status": plan.status}
    assert said == [("Warning", "ErrImagePull"), ("Warning", "ConfigError")]


def test_a_missing_bucket_secret_is_named_from_the_kubelets_failed_mount() -> None:
    """checkpoint.s3's credentials Secret is a volume: no container waits with a reason, the pod stays
    ContainerCreating, and the kubelet's FailedMount event is what names it."""
    s3 = {"s3": {"bucket": "ckpt", "credentialsSecret": {"name": "bucket-creds"}}}
    body = ddpjob_body({"phase": "Pending", "attempt": 1}, checkpoint=s3)
    pods, events = [mounting_pod(0), mounting_pod(1)], [failed_mount(MOUNT_NOT_FOUND)]
    plan = decision.decide(observed(body, [job_object(1)], pods, NOW, mount_events=events))
    ready = {c["type"]: c for c in plan.status["conditions"]}["Ready"]
    assert plan.status["phase"] == "Pending" and ready["reason"] == "FailedMount"
    assert MOUNT_NOT_FOUND in ready["message"] and "spec.checkpoint.s3.credentialsSecret" in ready["message"]
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "FailedMount")]
    again = decision.decide(
        observed({**body, "status": plan.status}, [job_object(1)], pods, NOW, mount_events=events)
    )
    assert again.events == () and again.delete_jobs == ()
    # the events not read: nothing to go by
    plain = decision.decide(observed(body, [job_object(1)], pods, NOW))
    assert _conditions(plain)["Ready"] == ("False", "Starting")


def test_success_reads_the_sync_report() -> None:
    pods = [
        pod_object(1, 0, phase="Succeeded", exit_code=0, message=json.dumps(REPORT)),
        pod_object(1, 1, exit_code=0),
    ]
    plan = reconcile_once({"phase": "Running", "attempt": 1}, [job_object(1, condition="Complete")], pods)
    assert plan.status["phase"] == "Succeeded" and plan.status["completionTime"] == "2026-11-22T12:00:00Z"
    assert plan.status["sync"] == {
        "verified": True,
        "checks": 7,
        "mismatches": 0,
        "repairs": 0,
        "lastCheckStep": 300,
        # the job's counts per attempt (issue 58 item 3): here one attempt of one world
        "attempts": [
            {"attempt": 1, "checks": 7, "mismatches": 0, "repairs": 0, "worlds": 1, "resumedFromStep": 0}
        ],
    }
    assert _conditions(plan)["Complete"] == ("True", "Completed")
    assert _conditions(plan)["SyncVerified"] == ("True", "BitIdentical")


def test_failure_restarts_the_gang() -> None:
    pods = [pod_object(1, 0, exit_code=1), pod_object(1, 1, exit_code=137)]
    plan = reconcile_once(
        {"phase": "Running", "attempt": 1},
        [job_object(1, condition="Failed", reason="BackoffLimitExceeded")],
        pods,
    )
    assert plan.status["phase"] == "Restarting"
    assert (plan.status["attempt"], plan.status["restarts"]) == (2, 1)
    assert plan.delete_jobs == ("job-1",) and plan.create_job is None
    assert "node 0 exited 1, node 1 was killed by SIGKILL (exit 137)" in plan.events[0].message


def test_next_attempt_waits_for_the_old_job_to_go() -> None:
    plan = reconcile_once(
        {"phase": "Restarting", "attempt": 2, "restarts": 1}, [job_object(1, condition="Failed")]
    )
    assert plan.delete_jobs == ("job-1",) and plan.create_job is None
    plan = reconcile_once({"phase": "Restarting", "attempt": 2, "restarts": 1}, [])
    assert plan.create_job is not None and plan.create_job["metadata"]["name"] == "job-2"
    assert plan.status["phase"] == "Pending"


def test_divergence_fails_without_restart() -> None:
    report = {
        **REPORT,
        "result": "Diverged",
        "verified": False,
        "mismatches": 1,
        "message": "fc.weight differs",
    }
    pods = [pod_object(1, 0, exit_code=1, message=json.dumps(report)), pod_object(1, 1, exit_code=1)]
    plan = reconcile_once({"phase": "Running", "attempt": 1}, [job_object(1, condition="Failed")], pods)
    assert plan.status["phase"] == "Failed" and plan.status["attempt"] == 1
    assert _conditions(plan)["Failed"] == ("True", "SyncDivergence")
    assert _conditions(plan)["SyncVerified"] == ("False", "Diverged")
    assert plan.create_job is None


def test_restarts_run_out() -> None:
    plan = reconcile_once(
        {"phase": "Running", "attempt": 3, "restarts": 2},
        [job_object(3, condition="Failed")],
        [pod_object(3, 0, exit_code=1)],
    )
    assert plan.status["phase"] == "Failed"
    assert _conditions(plan)["Failed"][1] == "MaxRestartsExceeded"


def test_terminal_phase_sticks_and_ttl_deletes() -> None:
    previous = {
        "phase": "Succeeded",
        "attempt": 1,
        "completionTime": "2026-11-22T11:00:00Z",
        "conditions": [
            {
                "type": "Complete",
                "status": "True",
                "reason": "Completed",
                "message": "",
                "lastTransitionTime": "2026-11-22T11:00:00Z",
            }
        ],
    }
    plan = reconcile_once(previous, [job_object(1, condition="Complete")])
    assert plan.status["phase"] == "Succeeded" and not plan.delete_self and plan.create_job is None
    assert reconcile_once(previous, [], ttlSecondsAfterFinished=3600).delete_self
    assert not reconcile_once(previous, [], ttlSecondsAfterFinished=3601).delete_self


def test_suspend_and_resume() -> None:
    plan = reconcile_once(
        {"phase": "Running", "attempt": 1}, [job_object(1)], [pod_object(1, 0)], suspend=True
    )
    assert plan.suspend_job == ("job-1", True) and plan.status["phase"] == "Suspended"
    plan = reconcile_once({"phase": "Suspended", "attempt": 1}, [job_object(1, suspend=True)], [])
    assert plan.suspend_job == ("job-1", False)


def test_a_suspended_creation_writes_its_status_once() -> None:
    """The status written with the suspended Job's creation is the one the next reconcile (the Job there,
    suspended, as the Job controller reports it) decides: no second status write, no second event."""
    created = reconcile_once(suspend=True)
    assert created.create_job is not None and created.status["phase"] == "Suspended"
    assert [e.reason for e in created.events] == ["Suspended"]
    job = job_object(1, condition="Suspended", reason="JobSuspended", suspend=True)
    later = reconcile_once(created.status, [job], now=NOW + dt.timedelta(seconds=2), suspend=True)
    assert later.status == created.status and later.events == () and later.create_job is None


def test_kueue_owns_the_suspension_of_queued_jobs() -> None:
    plan = reconcile_once(
        {"phase": "Pending", "attempt": 1}, [job_object(1, suspend=True)], [], queueName="team"
    )
    assert plan.suspend_job is None
    assert plan.status["phase"] == "Pending" and _conditions(plan)["Ready"][1] == "KueuePending"


def test_deadline_counts_restarts() -> None:
    previous = {"phase": "Running", "attempt": 2, "startTime": "2026-11-22T10:00:00Z"}
    plan = reconcile_once(previous, [job_object(2)], [pod_object(2, 0)], activeDeadlineSeconds=3600)
    assert plan.status["phase"] == "Failed" and plan.delete_jobs == ("job-2",)
    assert _conditions(plan)["Failed"][1] == "DeadlineExceeded"


def test_transition_times_are_kept_while_a_condition_holds() -> None:
    first = reconcile_once(
        {"phase": "Pending", "attempt": 1}, [job_object(1)], [pod_object(1, 0), pod_object(1, 1)]
    )
    later = reconcile_once(
        first.status, [job_object(1)], [pod_object(1, 0), pod_object(1, 1)], now=NOW + dt.timedelta(minutes=5)
    )
    ready = {c["type"]: c for c in later.status["conditions"]}["Ready"]
    assert ready["lastTransitionTime"] == "2026-11-22T12:00:00Z"
    assert later.events == ()


@pytest.mark.parametrize("phase", status.PHASES)
def test_phases_are_the_crd_enum(phase: str) -> None:
    from ddp_operator.api import crd

    assert phase in crd.openapi_schema()["properties"]["status"]["properties"]["phase"]["enum"]


def test_an_invalid_spec_fails_at_once_saying_why_and_creates_nothing() -> None:
    body = ddpjob_body({"phase": "Running", "attempt": 2, "startTime": "2026-11-22T11:00:00Z"})
    body["spec"]["trainer"] = "oops"  # a shape this operator cannot read (an older CRD stored it)
    plan = decision.decide(observed(body, [job_object(2)], [], NOW))
    assert plan.create_job is None and plan.create_service is None and plan.delete_jobs == ()
    assert plan.status["phase"] == "Failed" and plan.status["observedGeneration"] == 3
    assert plan.status["attempt"] == 2 and plan.status["completionTime"] == "2026-11-22T12:00:00Z"
    reason, message = _conditions(plan)["Failed"][1], plan.events[0].message
    assert reason == "InvalidSpec" and "cannot be read" in message and plan.events[0].type == "Warning"


def test_the_decision_carries_the_rendered_objects_of_the_current_attempt() -> None:
    plan = reconcile_once({"phase": "Restarting", "attempt": 3, "restarts": 2}, [])
    # attempt 3 of maxRestarts 2: two restarts used, none left for its agents to restart in place
    assert plan.create_job == render.render_job(spec_of(), 3, budget=0)
    assert plan.create_service == render.render_service(spec_of())


def test_the_first_attempt_creates_the_checkpoint_claim_and_later_reconciles_do_not() -> None:
    claim = {"checkpoint": {"volumeClaimTemplate": {"size": "1Gi"}}}
    plan = reconcile_once(**claim)
    assert plan.create_claim is not None and plan.create_claim["metadata"]["name"] == "job-checkpoints"
    assert (
        reconcile_once(
            {"phase": "Pending", "attempt": 1}, [job_object(1)], [pod_object(1, 0)], **claim
        ).create_claim
        is None
    )
    assert reconcile_once().create_claim is None


def test_a_preempted_attempt_restarts_and_is_counted_apart() -> None:
    report = {**REPORT, "result": "Interrupted", "reason": "Terminated"}
    pods = [pod_object(2, 0, exit_code=143, message=json.dumps(report)), pod_object(2, 1, exit_code=143)]
    previous = {"phase": "Running", "attempt": 2, "restarts": 1}
    plan = reconcile_once(previous, [job_object(2, condition="Failed")], pods, maxRestarts=1)
    assert plan.status["phase"] == "Restarting" and plan.status["preemptions"] == 1
    assert (plan.status["attempt"], plan.status["restarts"]) == (3, 2)
    assert plan.events[0].reason == "Preempted" and plan.delete_jobs == ("job-2",)
    later = reconcile_once(plan.status, [job_object(2, condition="Failed")], [], maxRestarts=1)
    assert later.status["preemptions"] == 1  # kept, not counted again


def test_a_durable_checkpoint_is_a_condition_and_an_empty_dir_says_restarts_start_over() -> None:
    assert _conditions(reconcile_once())["CheckpointsDurable"] == ("False", "EmptyDir")
    message = {c["type"]: c for c in reconcile_once().status["conditions"]}["CheckpointsDurable"]["message"]
    assert "restarts will start from step 0" in message
    durable = reconcile_once(checkpoint={"volumeClaimTemplate": {"size": "1Gi"}})
    assert _conditions(durable)["CheckpointsDurable"] == ("True", "Volume")


def test_rank0s_report_says_what_was_restored_and_skipped() -> None:
    report = {**REPORT, "resumedFromStep": 200, "skippedCheckpoints": ["step-00000300.pt: digest mismatch"]}
    report["warmStartedFrom"] = "ns/other"
    pods = [
        pod_object(1, 0, phase="Succeeded", exit_code=0, message=json.dumps(report)),
        pod_object(1, 1, exit_code=0),
    ]
    plan = reconcile_once({"phase": "Running", "attempt": 1}, [job_object(1, condition="Complete")], pods)
    assert plan.status["checkpoint"] == {
        "resumedFromStep": 200,
        "warmStartedFrom": "ns/other",
        "skipped": ["step-00000300.pt: digest mismatch"],
    }
    reasons = {e.reason: e for e in plan.events}
    assert {"WarmStarted", "CheckpointSkipped", "Completed"} <= set(reasons)
    assert (
        "digest mismatch" in reasons["CheckpointSkipped"].message
        and reasons["CheckpointSkipped"].type == "Warning"
    )


def test_a_failed_attempt_waits_for_its_pods_to_stop_and_report_within_the_grace_period() -> None:
    job = job_object(1, condition="Failed")
    job["status"]["conditions"][0]["lastTransitionTime"] = "2026-11-22T11:59:00Z"
    still_running = [pod_object(1, 0), pod_object(1, 1, exit_code=143)]  # rank 0 is still checkpointing
    plan = reconcile_once({"phase": "Running", "attempt": 1}, [job], still_running)
    assert plan.status["phase"] == "Restarting" and plan.status["attempt"] == 1 and plan.delete_jobs == ()
    assert _conditions(plan)["Ready"] == ("False", "StoppingAttempt")
    much_later = NOW + dt.timedelta(seconds=render.TERMINATION_GRACE_SECONDS + 60)
    plan = reconcile_once({"phase": "Restarting", "attempt": 1}, [job], still_running, now=much_later)
    assert plan.status["attempt"] == 2 and plan.delete_jobs == ("job-1",)  # decided without rank 0's report


def test_rank0s_report_is_remembered_after_its_pod_is_deleted() -> None:
    report = {**REPORT, "result": "Interrupted", "reason": "Terminated", "message": "stopped by a signal"}
    running = {"phase": "Running", "attempt": 1}
    seen = reconcile_once(
        running,
        [job_object(1)],
        [pod_object(1, 0, exit_code=143, message=json.dumps(report)), pod_object(1, 1)],
    )
    assert seen.status["lastReport"] == {
        "attempt": 1,
        "result": "Interrupted",
        "reason": "Terminated",
        "message": "stopped by a signal",
    }
    gone = reconcile_once(
        seen.status, [job_object(1, condition="Failed")], []
    )  # the Job controller deleted the pods
    assert gone.status["attempt"] == 2 and gone.status["preemptions"] == 1
    assert gone.events[0].reason == "Preempted"
    stale = reconcile_once({**seen.status, "attempt": 2}, [job_object(2, condition="Failed")], [])
    assert stale.status.get("preemptions") is None  # a report of attempt 1 says nothing about attempt 2


def test_a_deleted_pods_last_state_still_carries_rank0s_report() -> None:
    """The race met in a loaded full run: the Job controller deleted rank 0's pod after the attempt failed,
    and its "terminated" state and the DELETED event came within Kopf's batch window, so the index never
    showed the report: the preemption was taken for a crash. The DELETED event's body is kept instead."""
    report = {**REPORT, "result": "Interrupted", "reason": "Terminated", "message": "stopped by a signal"}
    rank0 = pod_object(1, 0, phase="Failed", exit_code=143, message=json.dumps(report))
    rank0["metadata"].update(uid="p0", deletionTimestamp="2026-11-22T11:59:50Z")
    running = {"phase": "Running", "attempt": 1}
    failed = [job_object(1, condition="Failed", reason="BackoffLimitExceeded")]
    assert (
        reconcile_once(running, failed, []).events[0].reason == "AttemptFailed"
    )  # what the index alone gave
    memory, key = Recent(), ("ns", "job")
    memory.pod_deleted(key, rank0, now=0.0)
    still = pod_object(1, 1)
    still["metadata"].update(uid="p1", deletionTimestamp="2026-11-22T11:59:50Z")
    memory.pod_deleted(key, still, now=0.0)  # deleted while its trainer runs: nothing to keep
    pods = memory.pods(key, [], now=1.0)
    assert [p["metadata"]["uid"] for p in pods] == ["p0"]
    plan = reconcile_once(running, failed, pods)
    assert plan.events[0].reason == "Preempted" and plan.status["preemptions"] == 1
    assert memory.pods(key, [rank0], now=2.0) == [rank0]  # never twice
    assert memory.pods(key, [], now=recent.POD_MEMORY_SECONDS + 1) == []


# -- live progress: the latest reading of the pods' metrics is one more input ----------------------------


def _running_pods() -> list[dict[str, Any]]:
    pods = [pod_object(1, 0), pod_object(1, 1)]
    for i, pod in enumerate(pods):
        pod["status"]["podIP"] = f"10.244.{i + 1}.7"
    return pods


def _snapshot(at: dt.datetime, step: int, attempt: int = 1, **extra: Any) -> live.Snapshot:
    reading = Progress(step=step, samples=step * 64.0, ranks=4, step_times={"0": (step / 10, step)}, **extra)
    answers = [live.Answer("job-1-0-abcde", "text"), live.Answer("job-1-1-abcde", "text")]
    return live.record(None, attempt, 9400, answers, at.timestamp(), reading)


def _running(previous: dict[str, Any], snapshot: live.Snapshot | None, now: dt.datetime = NOW) -> Plan:
    body = ddpjob_body(previous, trainer={"steps": 1000})
    return decision.decide(observed(body, [job_object(1)], _running_pods(), now, snapshot))


def test_a_running_job_is_read_and_its_progress_written() -> None:
    previous = {"phase": "Running", "attempt": 1}
    plan = _running(previous, None)
    assert plan.scrape is not None and plan.scrape.port == 9400 and plan.scrape.attempt == 1
    assert [t.url for t in plan.scrape.targets] == [
        "http://10.244.1.7:9400/metrics",
        "http://10.244.2.7:9400/metrics",
    ]
    assert "progress" not in plan.status  # nothing read yet: nothing said
    checked = {"checks_ok": 2, "last_check_ok": True, "last_check_time": NOW.timestamp()}
    plan = _running(previous, _snapshot(NOW, 250, **checked))
    progress = plan.status["progress"]
    assert (progress["step"], progress["totalSteps"], progress["summary"]) == (250, 1000, "25%")
    assert (progress["etaSeconds"], progress["eta"], progress["samplesPerSecond"]) == (75, "1m15s", 640.0)
    assert progress["computedAt"] == "2026-11-22T12:00:00Z" and progress["etaTime"] == "2026-11-22T12:01:15Z"
    assert plan.status["sync"]["checks"] == 2 and plan.status["sync"]["verified"] is True
    assert _conditions(plan)["SyncVerified"] == ("True", "BitIdentical")
    assert _conditions(plan)["MetricsScraped"] == ("True", "Scraped")
    assert "SyncVerified" in [e.reason for e in plan.events]


def test_progress_changes_at_most_every_ten_seconds_and_a_quiet_reconcile_writes_nothing() -> None:
    first = _running({"phase": "Running", "attempt": 1}, _snapshot(NOW, 250))
    body_status = first.status
    soon = NOW + dt.timedelta(seconds=5)
    again = _running(body_status, _snapshot(soon, 300), now=soon)
    assert again.status == body_status and again.events == ()  # apply writes nothing when they are equal
    later = NOW + dt.timedelta(seconds=10)
    moved = _running(body_status, _snapshot(later, 300), now=later)
    assert moved.status["progress"]["step"] == 300
    assert (
        _running(moved.status, _snapshot(later, 300), now=later + dt.timedelta(seconds=1)).status
        == moved.status
    )


def test_a_reading_of_another_attempt_is_ignored() -> None:
    plan = _running({"phase": "Running", "attempt": 1}, _snapshot(NOW, 250, attempt=2))
    assert "progress" not in plan.status


def test_pods_without_metrics_leave_the_job_healthy_and_say_so() -> None:
    answers = [
        live.Answer("job-1-0-abcde", None, refused=True),
        live.Answer("job-1-1-abcde", None, refused=True),
    ]
    snapshot = live.record(None, 1, 9400, answers, NOW.timestamp(), None)
    plan = _running({"phase": "Running", "attempt": 1}, snapshot)
    assert plan.status["phase"] == "Running" and _conditions(plan)["Ready"] == ("True", "AllNodesReady")
    assert _conditions(plan)["MetricsScraped"] == ("False", "NoMetrics")
    assert plan.status["progress"] == {
        "computedAt": "2026-11-22T12:00:00Z",
        "unreachable": ["job-1-0-abcde", "job-1-1-abcde"],
    }
    assert not [e for e in plan.events if e.type == "Warning"]
    timed_out = [live.Answer("job-1-0-abcde", None, error="timed out"), live.Answer("job-1-1-abcde", "x")]
    partly = live.record(None, 1, 9400, timed_out, NOW.timestamp(), Progress(step=3))
    plan = _running({"phase": "Running", "attempt": 1}, partly)
    assert _conditions(plan)["MetricsScraped"] == ("True", "PartlyUnreachable")
    assert plan.status["progress"]["unreachable"] == ["job-1-0-abcde"]


def test_a_finished_job_is_not_read_and_says_its_time_and_throughput() -> None:
    previous = {
        "phase": "Running",
        "attempt": 1,
        "startTime": "2026-11-22T11:58:00Z",
        "progress": {"step": 280, "totalSteps": 300, "samplesPerSecond": 640.0, "eta": "3s"},
    }
    pods = [pod_object(1, 0, phase="Succeeded", exit_code=0, message=json.dumps({**REPORT, "step": 300}))]
    plan = reconcile_once(previous, [job_object(1, condition="Complete")], pods, trainer={"steps": 300})
    assert plan.scrape is None
    assert plan.status["progress"]["summary"] == "100%" and plan.status["progress"]["eta"] == "0s"
    completed = [e.message for e in plan.events if e.reason == "Completed"]
    assert completed == ["attempt 1 completed in 2m00s: 300 steps, 640 samples/s"]


def test_the_status_patch_removes_what_the_new_status_dropped() -> None:
    old = {"phase": "Running", "progress": {"step": 3, "unreachable": ["p"]}, "gone": 1}
    new = {"phase": "Running", "progress": {"step": 9}}
    assert reconcile.merge_patch(old, new) == {
        "phase": "Running",
        "progress": {"step": 9, "unreachable": None},
        "gone": None,
    }


def test_restarts_in_place_are_counted_once_from_the_pods_readings_with_their_cause() -> None:
    cause = "rank 3 killed by signal 9"
    first = _running(
        {"phase": "Running", "attempt": 1}, _snapshot(NOW, 50, restarts_in_place=1, restart_cause=cause)
    )
    status = first.status
    assert (status["attempt"], status["restarts"], status["restartsInPlace"]) == (1, 1, 1)
    assert status["lastRestart"]["kind"] == "InPlace" and status["lastRestart"]["inAttempt"] == 1
    assert (
        cause in status["lastRestart"]["message"]
        and "1 of maxRestarts 2 used" in status["lastRestart"]["message"]
    )
    assert [e.reason for e in first.events if e.type == "Warning"] == ["RestartedInPlace"]
    later = NOW + dt.timedelta(seconds=30)
    again = _running(status, _snapshot(later, 90, restarts_in_place=1, restart_cause=cause), later)
    assert again.status["restarts"] == 1 and not [e for e in again.events if e.reason == "RestartedInPlace"]
    # the next Job's torchrun gets what is left of maxRestarts: 2 - 1 new attempt - 1 in place = 0
    failed = reconcile_once(
        {**status, "phase": "Running"},
        [job_object(1, condition="Failed", reason="BackoffLimitExceeded")],
        [pod_object(1, 0, phase="Failed", exit_code=1), pod_object(1, 1, phase="Failed", exit_code=1)],
    )
    assert failed.status["attempt"] == 2 and failed.status["restarts"] == 2
    assert failed.status["lastRestart"]["kind"] == "Recreate"
    job = decision.decide(observed(ddpjob_body(failed.status), [], [], NOW)).create_job
    assert job is not None
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[contract.PET_MAX_RESTARTS] == "0" and env[contract.PET_RDZV_BACKEND] == "c10d"


def test_a_restart_whose_workers_joined_the_others_heal_says_where_their_state_came_from() -> None:
    """A rigid job that heals (``DDPJOB_HEAL=1``): one pod's crashed rank restarted and copied its state
    from the others, which healed in place; the event says so, not "resuming from the last checkpoint"."""
    cause = "rank 1 (pid 7) was killed by SIGKILL"
    reading = _snapshot(
        NOW, 40, restarts_in_place=1, restart_cause=cause, restart_from=contract.RESTART_FROM_OTHERS
    )
    plan = _running({"phase": "Running", "attempt": 1}, reading)
    (event,) = [e for e in plan.events if e.reason == "RestartedInPlace"]
    assert cause in event.message and "copy their state from a live replica" in event.message, event.message
    assert "resuming from the last checkpoint" not in event.message
    assert plan.status["lastRestart"]["message"] == event.message


def test_a_restart_in_place_keeps_a_queued_jobs_admission() -> None:
    """Kueue admitted the Job (unsuspended it); a restart in place changes no child: the Job is neither
    re-suspended, deleted nor replaced, so the gang keeps its admission and its nodes."""
    body = ddpjob_body({"phase": "Running", "attempt": 1}, queueName="team", trainer={"steps": 1000})
    reading = _snapshot(NOW, 40, restarts_in_place=1, restart_cause="rank 1 killed by signal 9")
    plan = decision.decide(observed(body, [job_object(1)], _running_pods(), NOW, reading))
    assert plan.status["restartsInPlace"] == 1 and plan.status["phase"] == "Running"
    assert plan.suspend_job is None and plan.delete_jobs == () and plan.create_job is None


ELASTIC = {"minNodes": 1, "maxNodes": 4}


def test_a_scaled_elastic_job_resizes_its_job_in_place_without_a_new_attempt() -> None:
    """kubectl scale: spec.nodes 2 -> 3 while attempt 1's Job (2 pods) runs. The same Job gets
    completions = parallelism = 3; no new Job, no deletion, no restart; a Normal event; status.elastic."""
    previous = {"phase": "Running", "attempt": 1, "restarts": 0}
    body = ddpjob_body(previous, nodes=3, elastic=ELASTIC)
    plan = decision.decide(observed(body, [job_object(1)], _running_pods(), NOW))
    assert plan.resize_job == ("job-1", 3)
    assert plan.create_job is None and plan.delete_jobs == () and plan.status["attempt"] == 1
    assert plan.status.get("restarts", 0) == 0
    said = {e.reason: e for e in plan.events}
    assert [(e.type, e.reason) for e in plan.events] == [("Normal", "BelowDesired"), ("Normal", "Resized")]
    assert "from 2 to 3 nodes" in said["Resized"].message and "no restart spent" in said["Resized"].message
    elastic = plan.status["elastic"]
    assert (elastic["nodes"], elastic["desired"], elastic["resizes"]) == (2, 3, 1)
    assert elastic["lastResize"] == {"from": 2, "to": 3, "reason": "Scaled", "time": "2026-11-22T12:00:00Z"}
    assert elastic["summary"] == "2/3 (1-4)"
    # the world below the desired size but at least minNodes trains on: Running, said so
    assert plan.status["phase"] == "Running"
    assert _conditions(plan)["Ready"] == ("True", "BelowDesired")
    assert plan.status["selector"] == "ddpjob.io/job-name=job"
    # the next reconcile sees the Job at 3: nothing more to do, the count kept
    job = job_object(1)
    job["spec"]["completions"] = job["spec"]["parallelism"] = 3
    again = decision.decide(observed({**body, "status": plan.status}, [job], _running_pods(), NOW))
    assert again.resize_job is None and again.events == ()
    assert again.status["elastic"]["resizes"] == 1 and again.status["elastic"]["lastResize"]["to"] == 3


def test_a_rigid_job_is_never_resized_and_has_no_elastic_status() -> None:
    plan = decision.decide(
        observed(ddpjob_body({"phase": "Running", "attempt": 1}), [job_object(1)], _running_pods(), NOW)
    )
    assert plan.resize_job is None and "elastic" not in plan.status


def test_an_elastic_job_below_its_minimum_waits_saying_how_short_then_fails_naming_the_shortfall() -> None:
    """minNodes 2, desired 2: the world trained at 2 (status.elastic.nodes), then one pod is gone. The job
    waits (Ready False, BelowMinNodes, how many nodes short and for how long, belowMinSince kept across
    reconciles); past belowMinTimeoutSeconds it fails with that reason, naming the shortfall, without a
    restart. A job that never reached its minimum is only starting."""
    elastic = {"minNodes": 2, "maxNodes": 3, "belowMinTimeoutSeconds": 600}
    previous = {"phase": "Running", "attempt": 1, "restarts": 0, "elastic": {"nodes": 2, "resizes": 0}}
    body = ddpjob_body(previous, elastic=elastic)
    one = [pod_object(1, 0), pod_object(1, 1, phase="Pending", ready=False)]
    plan = decision.decide(observed(body, [job_object(1)], one, NOW))
    assert (plan.status["phase"], _conditions(plan)["Ready"]) == ("Running", ("False", "BelowMinNodes"))
    ready = {c["type"]: c for c in plan.status["conditions"]}["Ready"]
    assert ready["message"].startswith(
        "waiting for 1 more node: 1 of minNodes 2 running (desired 2) for 0 s; the job fails after "
        "spec.elastic.belowMinTimeoutSeconds (600 s)"
    ), ready
    assert plan.status["elastic"]["belowMinSince"] == "2026-11-22T12:00:00Z"
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "BelowMinNodes")]
    assert plan.delete_jobs == () and plan.create_job is None
    later = decision.decide(
        observed({**body, "status": plan.status}, [job_object(1)], one, NOW + dt.timedelta(seconds=601))
    )
    assert later.status["phase"] == "Failed" and later.status["restarts"] == 0, later.status
    failed = {c["type"]: c for c in later.status["conditions"]}["Failed"]
    assert failed["reason"] == "BelowMinNodes", failed
    assert (
        "only 1 of minNodes 2 nodes for 601 s, past spec.elastic.belowMinTimeoutSeconds (600 s): "
        "short by 1 node" in failed["message"]
    ), failed
    assert later.delete_jobs == ("job-1", "job-1-rdzv") and later.create_job is None  # and its store
    back = decision.decide(observed({**body, "status": plan.status}, [job_object(1)], _running_pods(), NOW))
    assert back.status["phase"] == "Running" and "belowMinSince" not in back.status["elastic"]
    fresh = decision.decide(
        observed(ddpjob_body({"phase": "Pending", "attempt": 1}, elastic=elastic), [job_object(1)], one, NOW)
    )
    assert _conditions(fresh)["Ready"][1] != "BelowMinNodes"
