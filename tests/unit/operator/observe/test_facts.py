"""observe: the children of a DDPJob read into facts, from objects shaped like the API server's."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from ddp_operator.api import names
from ddp_operator.decide import restarts
from ddp_operator.observe.facts import attempt_of, observe
from ddp_trainer import contract


def _job(attempt: int | str, condition: str | None = None, suspend: bool = False) -> dict[str, Any]:
    job: dict[str, Any] = {
        "metadata": {"name": f"job-{attempt}", "labels": {names.ATTEMPT_LABEL: str(attempt)}},
        "spec": {"suspend": suspend},
    }
    if condition:
        job["status"] = {"conditions": [{"type": condition, "status": "True", "reason": "X"}]}
    return job


def _pod(attempt: int, index: int, *, code: int | None = None, message: str = "", ready: bool = False) -> Any:
    state = {"terminated": {"exitCode": code, "message": message}} if code is not None else {}
    return {
        "metadata": {
            "labels": {names.ATTEMPT_LABEL: str(attempt)},
            "annotations": {names.COMPLETION_INDEX_ANNOTATION: str(index)},
        },
        "status": {
            "phase": "Running" if ready else "Pending",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": names.CONTAINER_NAME, "state": state}],
        },
    }


def test_nothing_yet_is_the_first_attempt() -> None:
    facts = observe({}, [], [])
    assert (facts.attempt, facts.job, facts.stale_jobs, facts.report) == (
        contract.FIRST_ATTEMPT,
        None,
        (),
        None,
    )


def test_the_newest_attempt_wins_and_older_jobs_are_stale() -> None:
    facts = observe({"attempt": 1}, [_job(1, "Failed"), _job(2)], [_pod(1, 0), _pod(2, 0, ready=True)])
    assert facts.attempt == 2 and facts.stale_jobs == ("job-1",)
    assert facts.job is not None and facts.job.name == "job-2" and not facts.job.failed
    assert facts.ready_nodes == 1  # the pod of attempt 1 does not count


def test_the_status_attempt_counts_before_its_job_exists() -> None:
    facts = observe({"attempt": 3}, [_job(2, "Failed")], [])
    assert facts.attempt == 3 and facts.job is None and facts.stale_jobs == ("job-2",)


def test_a_malformed_attempt_label_is_never_current() -> None:
    assert attempt_of(_job("x")) == 0
    assert observe({}, [_job("x")], []).stale_jobs == ("job-x",)


def test_a_failed_job_carries_its_outcome_with_rank_0s_report() -> None:
    report = json.dumps({"result": contract.DIVERGED, "checks": 2})
    pods = [_pod(1, 1, code=1), _pod(1, 0, code=contract.DIVERGENCE_EXIT_CODE, message=report)]
    facts = observe({}, [_job(1, "Failed")], pods)
    assert facts.job is not None and facts.job.failed and facts.job.outcome is not None
    assert facts.job.outcome.exit_codes == {0: contract.DIVERGENCE_EXIT_CODE, 1: 1}
    assert facts.job.outcome.message == f"node 0 exited {contract.DIVERGENCE_EXIT_CODE}, node 1 exited 1"
    assert facts.report == {"result": contract.DIVERGED, "checks": 2}


def test_a_crash_log_is_not_a_report() -> None:
    facts = observe({}, [_job(1)], [_pod(1, 0, code=1, message="Traceback (most recent call last):")])
    assert facts.report is None and facts.job is not None and facts.job.outcome is None


def test_a_disrupted_pod_makes_the_outcome_a_preemption() -> None:
    pod = _pod(1, 0, code=143)
    pod["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    )
    facts = observe({}, [_job(1, "Failed")], [pod])
    assert facts.job is not None and facts.job.outcome is not None and facts.job.outcome.reason == "Preempted"


def test_a_pod_that_failed_on_its_own_is_a_crash_and_deleted_or_stopped_pods_are_not() -> None:
    crash = [_pod(1, 0, code=143), _pod(1, 1, code=137)]
    outcome = observe({}, [_job(1, "Failed")], crash).job
    assert outcome is not None and outcome.outcome is not None and outcome.outcome.crashed
    deleted = _pod(1, 1, code=1)
    deleted["metadata"]["deletionTimestamp"] = "2026-11-22T12:00:00Z"  # torchrun exits 1 when stopped
    stopped = observe({}, [_job(1, "Failed")], [_pod(1, 0, code=143), deleted]).job
    assert stopped is not None and stopped.outcome is not None and not stopped.outcome.crashed


def test_a_job_failed_by_its_pod_failure_policy_is_a_configuration_error() -> None:
    job = _job(1, "Failed")
    job["status"]["conditions"][0].update(
        reason="PodFailurePolicy",
        message="Container trainer for pod ns/job-1-0 failed with exit code 2 matching FailJob rule",
    )
    facts = observe({}, [job], [_pod(1, 0, code=2)])
    assert facts.job is not None and facts.job.outcome is not None
    assert facts.job.outcome.reason == "PodFailurePolicy"
    assert restarts.decide(facts.job.outcome, 1, 3).reason == "UsageError"


def test_a_pod_that_stopped_with_the_gang_is_no_crash() -> None:
    """Pod 1 deleted: all ranks stop at the next step; pod 0's torchrun exits 1, its report Interrupted."""
    report = json.dumps({"result": "Interrupted", "reason": "Terminated", "message": "stopped"})
    deleted = _pod(1, 1, code=143)
    deleted["metadata"]["deletionTimestamp"] = "2026-11-22T12:00:00Z"
    facts = observe({}, [_job(1, "Failed")], [_pod(1, 0, code=1, message=report), deleted])
    assert facts.job is not None and facts.job.outcome is not None and not facts.job.outcome.crashed
    assert restarts.decide(facts.job.outcome, 1, 3).reason == restarts.PREEMPTED
    crashed = observe({}, [_job(1, "Failed")], [_pod(1, 0, code=1, message="Traceback ..."), deleted])
    assert crashed.job is not None and crashed.job.outcome is not None and crashed.job.outcome.crashed


def test_a_crash_log_names_the_failing_ranks_first_error() -> None:
    """A termination message that is a log tail (FallbackToLogsOnError): the exception, not torchrun's."""
    tail = "\n".join(
        [
            "[rank1]: Traceback (most recent call last):",
            '[rank1]:   File "/app/train.py", line 4, in <module>',
            "[rank1]: KeyError: 'LABELS'",
            "Root Cause (first observed failure):",
            "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        ]
    )
    facts = observe({}, [_job(1, "Failed")], [_pod(1, 0, code=143), _pod(1, 1, code=1, message=tail)])
    assert facts.job is not None and facts.job.outcome is not None
    assert (
        facts.job.outcome.message
        == "node 0 was stopped by SIGTERM (exit 143), node 1 exited 1: KeyError: 'LABELS'"
    )


def test_a_pod_evicted_from_a_lost_node_fails_the_attempt_at_once_as_a_preemption() -> None:
    """Under the Job's podFailurePolicy the Job controller waits for the evicted pod to end, which a pod
    on a node that does not answer never does: the attempt fails from the eviction itself, and the pods
    left running are not waited for (only the Job's deletion stops them)."""
    healthy, evicted = _pod(1, 0, ready=True), _pod(1, 1, ready=True)
    evicted["metadata"].update(name="p-1", deletionTimestamp="2026-01-01T00:00:40Z")
    evicted["spec"] = {"nodeName": "node-2"}
    evicted["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}
    )
    job = observe({"attempt": 1}, [_job(1)], [healthy, evicted]).job
    assert job is not None and job.failed and job.stopping_pods == 0
    assert job.outcome is not None and job.outcome.reason == restarts.PREEMPTED
    assert "p-1 on node-2" in job.outcome.message and not job.outcome.crashed
    # without the eviction the same Job runs on; a complete Job stays complete
    running = observe({"attempt": 1}, [_job(1)], [healthy, _pod(1, 1, ready=True)]).job
    assert running is not None and not running.failed
    done = observe({"attempt": 1}, [_job(1, "Complete")], [healthy, evicted]).job
    assert done is not None and done.complete and not done.failed


def test_rank_0s_success_and_the_pods_that_never_started_are_read_for_an_elastic_end() -> None:
    """decide.ending: the pod at index 0 succeeded; a Pending pod never started (and is not stopped)."""
    rank0, running = _pod(1, 0, code=0), _pod(1, 1, ready=True)
    rank0["status"]["phase"] = "Succeeded"
    rank0["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = "2026-11-22T11:59:50Z"
    found = observe({"attempt": 1}, [_job(1)], [rank0, running, _pod(1, 2)]).job
    assert found is not None and found.finished_index == 0 and not found.complete
    assert found.finished_at == dt.datetime(2026, 11, 22, 11, 59, 50, tzinfo=dt.UTC)  # its end's time
    assert (found.never_started, found.stopping_pods) == (1, 2)  # the Pending pod, and the running one
    plain = observe({"attempt": 1}, [_job(1)], [_pod(1, 0, ready=True), _pod(1, 1, code=0)]).job
    assert plain is not None and plain.finished_index is None and plain.never_started == 0


def _succeeded(index: int, step: int | None, result: str = "Succeeded") -> Any:
    said = {"result": result, "step": step, "verified": True} if step is not None else None
    pod = _pod(1, index, code=0, message=json.dumps(said) if said else "")
    pod["status"]["phase"] = "Succeeded"
    return pod


def test_an_elastic_job_whose_pod_0_left_the_world_ends_on_another_pods_report() -> None:
    """Pod 0 frozen (a silent node) or never started: the survivors' world had its rank 0 in another pod,
    whose report is the attempt's; the furthest step wins (a late joiner's report is not the end), then the
    lowest index. A rigid job, or pod 0 that ended, goes by pod 0 alone, as before."""
    frozen = _pod(1, 0, ready=True)
    pods = [frozen, _succeeded(1, 70, "Interrupted"), _succeeded(2, 800), _succeeded(3, 800)]
    facts = observe({"attempt": 1}, [_job(1)], pods, elastic=True)
    assert facts.job is not None and facts.job.finished_index == 2, facts.job
    assert facts.report is not None and facts.report["step"] == 800, facts.report
    assert observe({"attempt": 1}, [_job(1)], [_pod(1, 0), *pods[1:]], elastic=True).job.finished_index == 2  # type: ignore[union-attr]
    rigid = observe({"attempt": 1}, [_job(1)], pods)
    assert rigid.job is not None and rigid.job.finished_index is None and rigid.report is None
    failed = _pod(1, 0, code=1, message="Traceback: boom")
    ended = observe({"attempt": 1}, [_job(1)], [failed, *pods[1:]], elastic=True).job
    assert ended is not None and ended.finished_index is None  # pod 0 ended: its own word, not another's
    unreported = observe({"attempt": 1}, [_job(1)], [frozen, _succeeded(1, None)], elastic=True).job
    assert unreported is not None and unreported.finished_index is None
