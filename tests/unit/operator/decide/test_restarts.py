"""policy: the gang-restart decision shared by the operator and `ddpjob local`."""

from __future__ import annotations

import pytest

from ddp_operator.decide import restarts
from ddp_trainer import contract

POLICY = [
    ("success", restarts.Outcome(True), 1, 3, restarts.Action.SUCCEED, "Completed"),
    (
        "first failure restarts",
        restarts.Outcome(False, {0: 0, 1: 1}),
        1,
        3,
        restarts.Action.RESTART,
        "AttemptFailed",
    ),
    ("last restart used", restarts.Outcome(False, {0: 1}), 4, 3, restarts.Action.FAIL, "MaxRestartsExceeded"),
    ("no restarts allowed", restarts.Outcome(False, {0: 137}), 1, 0, restarts.Action.FAIL, "AttemptFailed"),
    (
        "divergence by report",
        restarts.Outcome(False, {0: 1}, {"result": "Diverged", "message": "w differs"}),
        1,
        3,
        restarts.Action.FAIL,
        "SyncDivergence",
    ),
    (
        "divergence by exit code",
        restarts.Outcome(False, {1: contract.DIVERGENCE_EXIT_CODE}),
        1,
        3,
        restarts.Action.FAIL,
        "SyncDivergence",
    ),
    (
        "another job's checkpoint, by report",
        restarts.Outcome(False, {0: 1}, {"result": "Failed", "reason": contract.FOREIGN_CHECKPOINT}),
        1,
        3,
        restarts.Action.FAIL,
        "ForeignCheckpoint",
    ),
    (
        "changed settings, by report",
        restarts.Outcome(False, {0: 1}, {"result": "Failed", "reason": contract.SETTINGS_CHANGED}),
        1,
        3,
        restarts.Action.FAIL,
        "SettingsChanged",
    ),
    (
        "refused checkpoint, by exit code",
        restarts.Outcome(False, {0: contract.CHECKPOINT_REFUSED_EXIT_CODE}),
        1,
        3,
        restarts.Action.FAIL,
        "CheckpointRefused",
    ),
    (
        "usage error, by exit code (a plain script)",
        restarts.Outcome(False, {0: 0, 1: contract.USAGE_EXIT_CODE}),
        1,
        3,
        restarts.Action.FAIL,
        "UsageError",
    ),
    (
        "refused command line, by report (torchrun exits 1)",
        restarts.Outcome(False, {0: 1}, {"result": "Failed", "reason": contract.INVALID_ARGUMENTS}),
        1,
        3,
        restarts.Action.FAIL,
        "InvalidArguments",
    ),
    (
        "the Job's podFailurePolicy failed it",
        restarts.Outcome(False, reason=restarts.POD_FAILURE_POLICY),
        1,
        3,
        restarts.Action.FAIL,
        "ConfigurationError",
    ),
    (
        "invalid spec",
        restarts.Outcome(False, reason="InvalidSpec", message="no such command"),
        1,
        3,
        restarts.Action.FAIL,
        "InvalidSpec",
    ),
    (
        "deadline passed",
        restarts.Outcome(False, {0: 137}, reason="DeadlineExceeded"),
        1,
        3,
        restarts.Action.FAIL,
        "DeadlineExceeded",
    ),
    (
        "crash report still restarts",
        restarts.Outcome(False, {0: 1}, {"result": "Failed"}),
        2,
        3,
        restarts.Action.RESTART,
        "AttemptFailed",
    ),
]


@pytest.mark.parametrize(
    ("outcome", "attempt", "max_restarts", "action", "reason"),
    [c[1:] for c in POLICY],
    ids=[c[0] for c in POLICY],
)
def test_policy(
    outcome: restarts.Outcome, attempt: int, max_restarts: int, action: restarts.Action, reason: str
) -> None:
    decision = restarts.decide(outcome, attempt, max_restarts)
    assert (decision.action, decision.reason) == (action, reason)
    assert decision.message


def test_restart_message_counts_restarts() -> None:
    decision = restarts.decide(restarts.Outcome(False, {0: 0, 1: 137}), 2, 3)
    assert (
        decision.message == "attempt 2 failed (node 1 was killed by SIGKILL (exit 137)); gang restart 2 of 3"
    )


def test_a_refused_checkpoint_says_why_and_does_not_restart() -> None:
    message = "checkpoint step-00000020.pt in /ckpt was written by DDPJob team/other (uid 1) at step 20"
    report = {"result": "Failed", "reason": contract.FOREIGN_CHECKPOINT, "message": message}
    decision = restarts.decide(restarts.Outcome(False, {0: 1}, report), 1, 3)
    assert decision.message == f"attempt 1: {message}; not restarting"


def test_a_preemption_restarts_without_using_up_restarts() -> None:
    interrupted = restarts.Outcome(
        False, {0: contract.INTERRUPTED_EXIT_CODE}, {"result": contract.INTERRUPTED}
    )
    decision = restarts.decide(interrupted, 4, 0)  # maxRestarts 0: a crash would fail here
    assert (decision.action, decision.reason) == (restarts.Action.RESTART, "Preempted")
    evicted = restarts.Outcome(False, {0: 137}, reason=restarts.PREEMPTED)
    assert restarts.decide(evicted, 1, 0).action is restarts.Action.RESTART


def test_preemptions_do_not_count_against_max_restarts() -> None:
    crashed = restarts.Outcome(False, {0: 1})
    assert restarts.decide(crashed, 3, 2).action is restarts.Action.FAIL  # 2 restarts so far, 2 allowed
    restart = restarts.decide(crashed, 3, 2, preemptions=1)  # one of the two was a preemption
    assert restart.action is restarts.Action.RESTART and restart.message.endswith("gang restart 2 of 2")


def test_a_crash_that_stopped_the_others_is_no_preemption() -> None:
    report = {"result": contract.INTERRUPTED}  # rank 0 was stopped by SIGTERM because node 1 crashed
    crashed = restarts.Outcome(False, {0: 143, 1: 137}, report, crashed=True)
    assert restarts.decide(crashed, 1, 3).reason == "AttemptFailed"
    assert restarts.decide(crashed, 1, 0).action is restarts.Action.FAIL


def test_a_trainer_error_says_rank_0s_reason() -> None:
    report = {"result": "Failed", "reason": "TrainerError", "message": "ValueError: no module nosuchpkg"}
    decision = restarts.decide(restarts.Outcome(False, {0: 1}, report), 1, 0)
    assert decision.message == (
        "attempt 1 failed (node 0 exited 1; rank 0: TrainerError: ValueError: no module nosuchpkg) "
        "and 0 restart(s) are used up"
    )


def test_configuration_exit_codes_are_usage_and_refused() -> None:
    assert contract.CONFIGURATION_EXIT_CODES == (2, 78)
    for code in contract.CONFIGURATION_EXIT_CODES:
        assert restarts.decide(restarts.Outcome(False, {0: code}), 1, 3).action is restarts.Action.FAIL
    assert restarts.decide(restarts.Outcome(False, {0: 1}), 1, 3).action is restarts.Action.RESTART


def test_restarts_in_place_count_against_max_restarts() -> None:
    """One bound for both kinds: restarts done in place (same pods) use up maxRestarts like new attempts."""
    crashed = restarts.Outcome(False, {0: 1})
    assert restarts.restarts_used(2, preemptions=1, in_place=2) == 2
    assert restarts.decide(crashed, 1, 2, in_place=2).reason == "MaxRestartsExceeded"
    restart = restarts.decide(crashed, 2, 3, in_place=1)  # 1 new attempt + 1 in place so far
    assert restart.action is restarts.Action.RESTART and restart.message.endswith("gang restart 3 of 3")


def test_the_budget_is_one_module_s_arithmetic() -> None:
    """status.restarts, what is used and what the next Job's agents get: all decide/restarts."""
    assert restarts.shown(attempt=3, in_place=1) == 3  # two new attempts and one in place
    used = restarts.restarts_used(3, preemptions=1, in_place=1)  # the preemption was free
    assert used == 2
    assert (restarts.left(3, used), restarts.left(2, used), restarts.left(1, used)) == (1, 0, 0)
