"""Which rank failed first (ddp_operator.observe.failures): the rank whose own error ended it, not its peers
that
saw it through a collective, across every pod's report; what the summary line and the sync sentence say."""

from __future__ import annotations

from typing import Any

import pytest

from ddp_operator.decide import restarts
from ddp_operator.observe import failures, sync_report
from ddp_trainer import contract

GLOO = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed "
    "by peer [127.0.0.1]:28545. This is typically caused by a remote worker crashing."
)
CRASH = "RuntimeError: injected crash on rank 1 at step 5"


def failure(rank: int, at: float, error: str) -> dict[str, Any]:
    return {"rank": rank, "at": at, "error": error, "restart": 0}


def test_the_rank_that_raised_is_first_and_its_peers_are_consequences() -> None:
    node0 = {"result": "Failed", "reason": "TrainerError", "message": GLOO}
    node0["failures"] = [failure(1, 100.0, CRASH), failure(0, 101.1, GLOO)]
    node1 = {"result": "Failed", "failures": [failure(2, 101.0, GLOO), failure(3, 101.2, GLOO)]}
    found = failures.gather([node0, node1])
    first, rest = failures.first_failure(found)
    assert first is not None and (first["rank"], first["error"]) == (1, CRASH)
    assert [e["rank"] for e in rest] == [2, 0, 3]
    text = failures.describe(found)
    assert text.startswith(f"rank 1 failed first, in your command: {CRASH}; then ranks 0, 2, 3 failed"), text
    assert "pair.cc" not in text and "Connection closed by peer" in text, text


@pytest.mark.parametrize(
    "peer",
    [
        GLOO,
        "DistBackendError: NCCL communicator was aborted on rank 0.",
        "RuntimeError: [../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms",
    ],
)
def test_an_own_error_wins_over_an_earlier_collective_error(peer: str) -> None:
    """Clocks of two nodes differ: a peer's collective error stamped earlier is still a consequence."""
    first, rest = failures.first_failure([failure(0, 99.0, peer), failure(3, 100.0, "ValueError: bad batch")])
    assert first is not None and first["rank"] == 3 and [e["rank"] for e in rest] == [0]


def test_without_an_own_error_the_earliest_is_named_and_nothing_is_none() -> None:
    first, _ = failures.first_failure([failure(2, 5.0, GLOO), failure(0, 4.0, GLOO)])
    assert first is not None and first["rank"] == 0
    assert failures.first_failure([]) == (None, []) and failures.describe([]) == ""


def test_gather_keeps_each_ranks_earliest_failure_and_skips_what_is_not_one() -> None:
    found = failures.gather(
        [
            None,
            {"failures": [failure(1, 7.0, "B"), {"rank": "x"}, "junk"]},
            {"failures": [failure(1, 3.0, "A")]},
        ]
    )
    assert found == [failure(1, 3.0, "A")]


def test_the_summary_and_the_sync_sentence_name_the_rank_that_failed_in_your_words() -> None:
    report = {"result": "Failed", "reason": "TrainerError", "message": GLOO, "checks": 1}
    report["failures"] = [failure(0, 101.1, GLOO), failure(1, 100.0, CRASH)]
    decision = restarts.decide(restarts.Outcome(False, {0: 1}, report, message="node 0 exited 1"), 1, 0)
    assert decision.message.startswith(
        f"attempt 1 failed (rank 1 failed first, in your command: {CRASH}; "
    ), decision.message
    assert "TrainerError" not in decision.message
    sentence = sync_report.sync_sentence(report)
    assert sentence.startswith(f"no verdict: your command failed on rank 1 ({CRASH})"), sentence
    # the built-in trainer's own failure keeps its words
    plain = {"result": "Failed", "reason": "TrainerError", "message": "boom", "checks": 0}
    assert "the trainer failed (TrainerError: boom)" in sync_report.sync_sentence(plain)
    assert (
        "rank 0: TrainerError: boom" in restarts.decide(restarts.Outcome(False, {0: 1}, plain), 1, 0).message
    )


def test_a_users_code_that_raised_is_said_in_a_users_words() -> None:
    users = {"result": "Failed", "reason": "CommandError", "message": "ZeroDivisionError: x", "checks": 1}
    assert sync_report.sync_sentence(users).startswith(
        "no verdict: your command failed (ZeroDivisionError: x)"
    )
    said = restarts.decide(restarts.Outcome(False, {0: 1}, users), 1, 0).message
    assert "rank 0: in your command: ZeroDivisionError: x" in said and "TrainerError" not in said, said


def test_ranks_that_each_raised_the_same_error_all_failed_on_their_own() -> None:
    """Every rank hit the same FileNotFoundError itself (a script run from the wrong folder): none failed
    'as a consequence'; a collective error after it still is one, and another own error is said apart."""
    missing = "FileNotFoundError: [Errno 2] No such file or directory: 'configurator.py'"
    same = [{"rank": r, "error": missing, "at": 10.0 + r} for r in range(4)]
    assert failures.describe(same) == f"ranks 0–3 all failed in your command, rank 0 first: {missing}"
    mixed = [
        *same[:2],
        {"rank": 2, "error": "RuntimeError: Connection closed by peer [10.0.0.2]:1234", "at": 12.0},
        {"rank": 3, "error": "KeyError: 'lr'", "at": 13.0},
    ]
    said = failures.describe(mixed)
    assert said.startswith(f"ranks 0, 1 all failed in your command, rank 0 first: {missing}"), said
    assert "; then rank 3 failed on their own (KeyError: 'lr')" in said, said
    assert "; then rank 2 failed as a consequence (RuntimeError: Connection closed by peer" in said, said
    assert failures.ranks([{"rank": r} for r in (0, 1, 2, 3, 6, 8, 9)]) == "0–3, 6, 8, 9"


def test_a_crash_on_every_rank_names_the_rank_that_failed_first_by_time() -> None:
    """Issue 58, item 4: four ranks raise the same error, rank 3 a moment before the others; the summary
    and the sync sentence name rank 3 as the first, and count no "none of its 0 sync checks"."""
    missing = "FileNotFoundError: [Errno 2] No such file or directory: 'snapshot.pt'"
    times = {0: 10.4, 1: 10.2, 2: 10.3, 3: 10.1}
    crashed = [{"rank": r, "error": missing, "at": at} for r, at in times.items()]
    assert failures.describe(crashed) == f"ranks 0–3 all failed in your command, rank 3 first: {missing}"
    report = {"result": "Failed", "reason": "CommandError", "message": missing, "failures": crashed}
    assert sync_report.sync_sentence({**report, "checks": 0}) == (
        f"no verdict: your command failed on ranks 0–3, rank 3 first ({missing}); no sync check had run"
    )
    assert sync_report.sync_sentence({**report, "checks": 2}).endswith(
        "; none of its 2 sync checks found ranks differing"
    )
    together = [{"rank": r, "error": missing, "at": 10.0} for r in range(4)]  # no one first: not invented
    assert (
        failures.describe(together) == f"ranks 0–3 all failed in your command, at the same moment: {missing}"
    )
    untimed = [{"rank": r, "error": missing} for r in range(2)]
    assert failures.describe(untimed).startswith("ranks 0, 1 all failed in your command, at the same moment")


def test_a_rank_stopped_for_a_silent_peer_is_not_blamed_on_the_users_command() -> None:
    error = f"{contract.SILENT_PEER}: node(s) job-1-1.job (pid 1) went silent: no keep-alive for 15.5 s"
    text = failures.describe([{"rank": 0, "at": 1.0, "error": error}])
    assert text == f"rank 0 was stopped because {error}", text
    assert "your command" not in text
