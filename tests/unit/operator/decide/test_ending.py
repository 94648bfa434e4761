"""An elastic job's end (issue 54, item 4): capacity that never comes does not hold it back, and exit codes
alone never make it Succeeded. Rank 0's report decides; the pods that never started (Pending for want of a
node, gated by Kueue) are ended by shrinking the Job to index 0."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from ddp_operator.children import render
from ddp_operator.decide import decision, ending, restarts
from ddp_operator.decide.plan import Plan
from ddp_operator.observe.facts import JobFacts
from helpers.reconciling import NOW, ddpjob_body, observed, pod_object, spec_of

ELASTIC: dict[str, Any] = {"elastic": {"minNodes": 1, "maxNodes": 3}, "nodes": 3}
STEPS = 1000  # spec_of()'s trainer.steps
RUNNING = {"phase": "Running", "attempt": 1, "elastic": {"nodes": 2}}
NO_CAPACITY = "0/3 nodes are available: 3 node(s) were unschedulable."


def _report(
    result: str = "Succeeded", step: int = STEPS, verified: bool = True, **more: Any
) -> dict[str, Any]:
    reason = "AllChecksPassed" if verified else "DivergenceIgnored"
    return {
        "result": result,
        "reason": reason,
        "message": f"{step} steps",
        "step": step,
        "verified": verified,
    } | more


def _done(index: int, report: dict[str, Any] | None = None) -> dict[str, Any]:
    """A pod that exited 0 (rank 0's with ``report`` as its termination message)."""
    message = json.dumps(report) if report is not None else None
    return pod_object(1, index, phase="Succeeded", ready=False, exit_code=0, message=message)


def _pending(index: int) -> dict[str, Any]:
    """A scale-up pod that never ran: no node has room for it."""
    return pod_object(1, index, phase="Pending", ready=False, unschedulable=NO_CAPACITY)


def _gated(index: int) -> dict[str, Any]:
    """A scale-up pod behind Kueue's scheduling gate (its Workload slice is never admitted)."""
    pod = pod_object(1, index, phase="Pending", ready=False)
    pod["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated", "message": "gated"}
    ]
    return pod


def _job(condition: str | None = None, **spec: Any) -> dict[str, Any]:
    """Attempt 1's Job as the operator renders it, with a ``condition`` of the Job controller's."""
    job = render.render_job(spec_of(**(spec or ELASTIC)), 1)
    if condition:
        job["status"] = {"conditions": [{"type": condition, "status": "True", "reason": "X", "message": ""}]}
    return job


def _decide(
    jobs: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    previous: dict[str, Any] | None = None,
    **spec: Any,
) -> Plan:
    return decision.decide(observed(ddpjob_body(previous or RUNNING, **(spec or ELASTIC)), jobs, pods, NOW))


def _condition(plan: Plan, kind: str) -> dict[str, Any]:
    found: dict[str, Any] = {c["type"]: c for c in plan.status["conditions"]}[kind]
    return found


# -- the report's verdict --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("report", "total", "done", "reason"),
    [
        (_report(), STEPS, True, ""),
        (_report(step=STEPS + 5), STEPS, True, ""),  # a spec lowered after the Job was made
        (_report("Interrupted", step=70), 400, False, ending.ENDED_EARLY),  # bench/RESULTS.md's late joiner
        (_report(step=70), 400, False, ending.ENDED_EARLY),  # said Succeeded, short of the steps
        ({"result": "Succeeded", "verified": True}, 400, False, ending.ENDED_EARLY),  # no step to go by
        (None, STEPS, False, ending.ENDED_EARLY),  # exit codes alone: nothing says it finished
        (_report(verified=False), STEPS, False, ending.NOT_VERIFIED),  # diverged, and it was not Warn
        (_report(step=12), 0, True, ""),  # a command of the user's: its own report says it finished
        ({"result": "Succeeded", "reason": "NoDDPModel", "message": "nothing to verify"}, 0, True, ""),
        ({"result": "Succeeded", "reason": "SyncHookOff", "message": "could not switch on"}, 0, True, ""),
        (
            {"result": "Failed", "reason": "TrainerError", "message": "boom", "step": 3},
            0,
            False,
            "EndedEarly",
        ),
    ],
)
def test_rank_0s_report_says_whether_the_training_finished_verified(
    report: dict[str, Any] | None, total: int, done: bool, reason: str
) -> None:
    found = ending.verdict(report, total)
    assert (found.done, found.reason) == (done, reason), found
    if not done:
        assert found.message.startswith("rank 0"), found.message


def test_only_a_job_whose_pods_write_no_report_goes_by_its_completion() -> None:
    assert ending.verdict(None, 0, expected=False).done
    assert ending.writes_report(spec_of(**ELASTIC))  # the built-in trainer
    assert ending.writes_report(spec_of(args=["python", "train.py"], **ELASTIC))  # the sync hook's report
    hookless = spec_of(args=["python", "train.py"], syncCheck={"autoInstrument": False}, **ELASTIC)
    assert not ending.writes_report(hookless)


# -- when an elastic attempt has ended --------------------------------------------------------------------


def _facts(**kind: Any) -> JobFacts:
    said: dict[str, Any] = {"complete": False, "failed": False, "suspended": False, "outcome": None} | kind
    return JobFacts("job-1", **said)


@pytest.mark.parametrize(
    ("codes", "reports", "found"),
    [
        ([0, None], [_report(), None], 0),  # a peer still running: ended all the same
        ([None, 0], [None, _report()], 1),  # node 0 left the world (frozen): another's report says it
        ([0, 0], [_report(step=70), _report()], 1),
        ([0, -9], [_report("Interrupted", step=70), None], None),  # a late joiner's: not the end
        ([0, None], [None, None], None),  # no report: the pods' exits decide, as before
        ([1, None], [_report(), None], None),  # it failed: its report is not read
        ([0, None], [_report(verified=False), None], None),
    ],
)
def test_ddpjob_local_reads_the_end_from_a_pod_that_exited_0_with_its_report(
    codes: list[int | None], reports: list[dict[str, Any] | None], found: int | None
) -> None:
    assert ending.finished_pod(codes, reports, STEPS) == found


@pytest.mark.parametrize(
    ("facts", "report", "ended", "shrink"),
    [
        (_facts(), _report(), False, None),  # training
        (_facts(finished_index=0, stopping_pods=1, never_started=1), _report(), True, ("job-1", 1)),
        (_facts(finished_index=0, stopping_pods=2, never_started=1), _report(), False, None),  # one runs
        (_facts(finished_index=0, stopping_pods=1), _report(), False, None),  # it runs: it ends by itself
        (_facts(finished_index=0), _report(), False, None),  # the Job completes by itself
        (_facts(finished_index=0, stopping_pods=1, never_started=1), _report(step=70), False, None),
        (_facts(finished_index=0, stopping_pods=1, never_started=1), None, False, None),
        (_facts(stopping_pods=1, never_started=1), _report(), False, None),  # rank 0 has not ended
        (_facts(complete=True), _report(), True, None),
        (_facts(complete=True), _report(step=70), True, None),  # ended: the policy decides what follows
        (_facts(finished_index=0, failed=True), _report(), False, None),  # a failure: restarts decide
        (_facts(finished_index=2, stopping_pods=1, never_started=1), _report(), True, ("job-1", 0)),  # pod 0
    ],
)
def test_an_elastic_attempt_ends_with_rank_0_not_with_the_last_pod(
    facts: JobFacts, report: dict[str, Any] | None, ended: bool, shrink: tuple[str, int] | None
) -> None:
    end = ending.elastic_end(facts, report, STEPS, expected=True)
    assert (end is not None) == ended, end
    assert end is None or end.shrink == shrink


# -- the decision ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("never_ran", [_pending, _gated], ids=["no-capacity", "kueue-gated"])
def test_rank_0_done_and_verified_succeeds_while_a_scale_up_pod_never_ran(never_ran: Any) -> None:
    pods = [_done(0, _report()), _done(1), never_ran(2)]
    plan = _decide([_job()], pods)
    assert plan.status["phase"] == "Succeeded", plan.status
    assert _condition(plan, "Complete")["reason"] == "Completed"
    assert _condition(plan, "SyncVerified")["status"] == "True"
    message = _condition(plan, "Complete")["message"]
    assert "1 pod(s) never started" in message and "shrinking the Job to index 0" in message, message
    # the pod left is ended: the Job shrinks to its index 0 (which completes it), and the rendezvous store
    # goes with the finished job; the pods that ran are not deleted (their logs stay)
    assert plan.resize_job == ("job-1", 1) and plan.delete_jobs == ("job-1-rdzv",) and plan.create_job is None
    assert plan.status["progress"]["step"] == STEPS and plan.status["progress"]["percent"] == 100
    # until the shrink has landed (the Job complete), each reconcile asks for it again; then nothing more
    again = _decide([_job()], pods, plan.status)
    assert again.status["phase"] == "Succeeded" and again.resize_job == ("job-1", 1)
    complete = _decide([_job("Complete")], pods[:2], plan.status)
    assert complete.resize_job is None and complete.status == again.status and complete.delete_jobs == ()


def _done_at(index: int, seconds_ago: float, report: dict[str, Any] | None = None) -> dict[str, Any]:
    """:func:`_done`, its container ended ``seconds_ago`` before :data:`NOW`."""
    pod = _done(index, report)
    ended = NOW - dt.timedelta(seconds=seconds_ago)
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = ended.isoformat()
    return pod


def test_a_pod_still_running_is_waited_for_until_the_finish_wait_passed() -> None:
    """A peer finishing in the same second (or a late joiner about to find the rendezvous closed) ends by
    itself: nothing is shrunk under it. One still running FINISH_WAIT_SECONDS after rank 0 finished left the
    world (a silent node: frozen, powered off, cut off) and never ends by itself: it does not hold back a job
    whose training finished, verified (issue 54: "kill the frozen processes later: the job Succeeds in one
    attempt"); the shrink to index 0 ends it."""
    wait = ending.FINISH_WAIT_SECONDS
    for pods in (
        [_done(0, _report()), pod_object(1, 1), _pending(2)],
        [_done_at(0, wait - 1, _report()), pod_object(1, 1)],
    ):
        plan = _decide([_job()], pods)
        assert plan.status["phase"] == "Running" and plan.resize_job is None, plan.status
    silent = [_done_at(0, wait, _report()), pod_object(1, 1), _pending(2)]
    plan = _decide([_job()], silent)
    assert plan.status["phase"] == "Succeeded" and plan.resize_job == ("job-1", 1), plan.status
    message = _condition(plan, "Complete")["message"]
    assert "1 pod(s) never started" in message and "1 pod(s) still ran 10 s after rank 0 finished" in message
    short = _decide([_job()], [_done_at(0, 60, _report(step=70)), pod_object(1, 1)])
    assert short.status["phase"] == "Running" and short.resize_job is None  # rank 0's word decides, not time


def test_pod_0_that_left_the_world_does_not_hold_back_the_end_the_others_reported() -> None:
    """Pod 0 went silent (frozen, cut off) and stayed so: the survivors' world had its rank 0 in pod 1, whose
    report says the training finished, verified. After the finish wait the DDPJob Succeeds and the Job is
    shrunk to no index (completions 0), which ends pod 0 and completes the Job; before it, nothing."""
    wait = ending.FINISH_WAIT_SECONDS
    early = _decide([_job()], [pod_object(1, 0), _done_at(1, wait - 1, _report())])
    assert early.status["phase"] == "Running" and early.resize_job is None, early.status
    silent = [pod_object(1, 0), _done_at(1, wait, _report()), _pending(2)]
    plan = _decide([_job()], silent)
    assert plan.status["phase"] == "Succeeded" and plan.resize_job == ("job-1", 0), plan.status
    assert plan.status["progress"]["step"] == STEPS
    message = _condition(plan, "Complete")["message"]
    assert "1 pod(s) still ran 10 s after rank 0 finished" in message, message
    assert "shrinking the Job to no index (pod 0 was one of them)" in message, message
    again = _decide([_job()], silent, plan.status)  # until the shrink has landed
    assert again.status == plan.status and again.resize_job == ("job-1", 0)
    short = _decide([_job()], [pod_object(1, 0), _done_at(1, 60, _report(step=70))])
    assert short.status["phase"] == "Running" and short.resize_job is None


def test_all_pods_exited_0_but_rank_0_short_of_the_last_step_is_not_succeeded() -> None:
    """bench/RESULTS.md's late joiner: a pod exited 0 and the Job completed at step 70 of 400."""
    late = [_done(0, _report("Interrupted", step=70)), _done(1)]
    plan = _decide([_job("Complete")], late)
    assert plan.status["phase"] == "Restarting" and plan.status["attempt"] == 2, plan.status
    ready = _condition(plan, "Ready")
    assert ready["reason"] == "EndedEarly", ready
    assert "rank 0's report says Interrupted at step 70 of 1000" in ready["message"], ready["message"]
    assert plan.delete_jobs == ("job-1", "job-1-rdzv")  # a new gang resumes from the checkpoint
    assert plan.status["restarts"] == 1  # counted: not a preemption, whatever the report's result
    out_of_restarts = _decide([_job("Complete")], late, maxRestarts=0, **ELASTIC)
    assert out_of_restarts.status["phase"] == "Failed"
    assert _condition(out_of_restarts, "Failed")["reason"] == "EndedEarly"


def test_a_complete_job_without_any_report_is_not_succeeded() -> None:
    plan = _decide([_job("Complete")], [_done(0), _done(1)])
    assert plan.status["phase"] == "Restarting", plan.status
    assert "rank 0 wrote no report" in _condition(plan, "Ready")["message"]


def test_rank_0_short_of_the_end_does_not_end_the_attempt_ahead_of_the_job() -> None:
    plan = _decide([_job()], [_done(0, _report(step=70)), _done(1), _pending(2)])
    assert plan.status["phase"] == "Running" and plan.resize_job is None and plan.delete_jobs == ()


def test_trained_to_the_end_unverified_fails_without_a_restart() -> None:
    plan = _decide([_job("Complete")], [_done(0, _report(verified=False)), _done(1)])
    assert plan.status["phase"] == "Failed", plan.status
    failed = _condition(plan, "Failed")
    assert failed["reason"] == "NotVerified" and "not restarting" in failed["message"], failed


def test_a_command_without_a_report_succeeds_by_its_completion_only() -> None:
    spec: dict[str, Any] = {"args": ["python", "train.py"], "syncCheck": {"autoInstrument": False}, **ELASTIC}
    complete = _decide([_job("Complete", **spec)], [_done(0), _done(1)], **spec)
    assert complete.status["phase"] == "Succeeded"
    early = _decide([_job(**spec)], [_done(0), _done(1), _pending(2)], **spec)
    assert early.status["phase"] != "Succeeded" and early.resize_job != ("job-1", 1)


def test_a_rigid_job_is_unchanged() -> None:
    short = [_done(0, _report("Interrupted", step=70)), _done(1)]
    rigid: dict[str, Any] = {"nodes": 2}
    complete = _decide([_job("Complete", **rigid)], short, {"phase": "Running", "attempt": 1}, **rigid)
    assert complete.status["phase"] == "Succeeded"  # as before: its Job completes only when every pod has
    waiting = _decide(
        [_job(**rigid)], [_done(0, _report()), _pending(1)], {"phase": "Running", "attempt": 1}, **rigid
    )
    assert waiting.status["phase"] != "Succeeded" and waiting.resize_job is None


def test_the_job_is_rendered_as_before_without_a_success_policy() -> None:
    """The Job controller's successPolicy (succeededIndexes "0") would delete a peer still finishing, its
    log with it: the operator ends only the pods that never started (decide.ending)."""
    assert "successPolicy" not in render.render_job(spec_of(**ELASTIC), 1)["spec"]
    assert "successPolicy" not in render.render_job(spec_of(), 1)["spec"]


def test_the_policy_restarts_an_attempt_that_ended_early_and_fails_an_unverified_one() -> None:
    interrupted = {"result": "Interrupted", "step": 70}
    early = restarts.Outcome(False, report=interrupted, reason=ending.ENDED_EARLY, message="short")
    decided = restarts.decide(early, 1, 2)
    assert decided.action is restarts.Action.RESTART and decided.reason == "EndedEarly", decided
    unverified = restarts.Outcome(
        False, report=_report(verified=False), reason=ending.NOT_VERIFIED, message="x"
    )
    assert restarts.decide(unverified, 1, 2).action is restarts.Action.FAIL


def test_under_warn_a_divergence_at_the_end_does_not_fail_an_elastic_job_nor_a_rigid_one() -> None:
    found = ending.verdict(_report(verified=False), STEPS, warn=True)
    assert found.done, found
