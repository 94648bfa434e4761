"""The final report and the termination message (:mod:`ddp_trainer.reporting.report`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ddp_operator.decide import checkpoints
from ddp_trainer import contract
from ddp_trainer.reporting import report
from ddp_trainer.sync.checking import Tally

FACTS = report.RunFacts(step=20, world_size=4, resumed_from=10, attempt=2)
PASSED = Tally(checks=4, last_check_step=20, last_check_ok=True)


def test_termination_message_fits_the_kubernetes_limit() -> None:
    big = {
        "result": "Diverged",
        "message": "x" * 10_000,
        "mismatchedTensors": [f"layer.{i}.w" * 9 for i in range(999)],
    }
    text = report.termination_message(big | {"maxAbsDiff": float("inf")})
    data = json.loads(text)
    assert len(text.encode()) < 4096
    assert data["result"] == "Diverged" and data["mismatchedTensors"] and data["maxAbsDiff"] == "inf"


def test_a_run_that_trained_to_the_end_and_passed_every_check() -> None:
    code, r = report.finished(PASSED, FACTS, steps=20, model_digest="abc")
    assert code == contract.SUCCESS_EXIT_CODE == 0
    assert r == {
        "result": contract.SUCCEEDED,
        "reason": "AllChecksPassed",
        "message": "20 steps, 4 sync checks",
        "verified": True,
        "checks": 4,
        "mismatches": 0,
        "repairs": 0,
        "lastCheckStep": 20,
        "step": 20,
        "worldSize": 4,
        "mismatchedTensors": [],
        "divergedRanks": [],
        "maxAbsDiff": 0.0,
        "resumedFromStep": 10,
        "attempt": 2,
        "modelDigest": "abc",
    }
    assert set(r) <= set(contract.Report.__annotations__)
    assert contract.parse_report(report.termination_message(r)) == r


@pytest.mark.parametrize(
    ("tally", "reason", "verified"),
    [
        (Tally(checks=5, mismatches=1, repairs=1, last_check_ok=True), "RepairedDivergence", True),
        (Tally(checks=5, mismatches=2, last_check_ok=True), "DivergenceIgnored", False),
    ],
)
def test_a_repaired_or_ignored_divergence_still_succeeds(tally: Tally, reason: str, verified: bool) -> None:
    code, r = report.finished(tally, FACTS, steps=20, model_digest="abc")
    assert (code, r["result"], r["reason"], r["verified"]) == (0, contract.SUCCEEDED, reason, verified)
    if not verified:
        assert r["message"] == "2 check(s) found divergence (policy Warn)"


def test_a_run_stopped_by_a_signal_is_interrupted_not_finished() -> None:
    facts = report.RunFacts(step=12, world_size=2, resumed_from=0, attempt=1)
    code, r = report.finished(PASSED, facts, steps=20, model_digest="abc")
    assert code == contract.INTERRUPTED_EXIT_CODE == 143
    assert (r["result"], r["reason"], r["step"]) == (contract.INTERRUPTED, "Terminated", 12)
    assert r["message"] == "stopped by a signal at step 12 of 20" and r["modelDigest"] == "abc"


def test_a_divergence_exits_86_with_what_differed() -> None:
    tally = Tally(checks=2, mismatches=1, last_check_step=10, mismatched_tensors=["w"], diverged_ranks=[1])
    code, r = report.diverged(tally, FACTS, "SyncDivergence", "1 tensor(s) differ between ranks: w")
    assert code == contract.DIVERGENCE_EXIT_CODE == 86
    assert (r["result"], r["reason"], r["verified"]) == (contract.DIVERGED, "SyncDivergence", False)
    assert (r["mismatchedTensors"], r["divergedRanks"], r["lastCheckStep"]) == (["w"], [1], 10)
    assert "modelDigest" not in r


def test_a_failure_reports_what_is_known() -> None:
    code, bare = report.failed("ValueError: boom")
    assert code == contract.FAILURE_EXIT_CODE
    assert bare == {"result": contract.FAILED, "reason": "TrainerError", "message": "ValueError: boom"}
    code, full = report.failed("RuntimeError: x", Tally(), report.RunFacts(0, 2, 0, 1))
    assert (full["result"], full["checks"], full["lastCheckStep"], full["worldSize"]) == (
        contract.FAILED,
        0,
        0,
        2,
    )


def test_a_refused_checkpoint_fails_with_the_never_retry_exit_code_and_what_was_skipped() -> None:
    skipped = ("step-00000030.pt: truncated: 3 of 9 payload bytes",)
    facts = report.RunFacts(0, 4, 0, 1, skipped_checkpoints=skipped)
    message = "checkpoint step-00000020.pt in /ckpt was written by DDPJob team/other (uid 2) at step 20"
    code, r = report.refused(contract.FOREIGN_CHECKPOINT, message, Tally(), facts)
    assert code == contract.CHECKPOINT_REFUSED_EXIT_CODE == 78
    assert (r["result"], r["reason"], r["message"]) == (contract.FAILED, "ForeignCheckpoint", message)
    assert (r["step"], r["checks"], r["resumedFromStep"]) == (0, 0, 0)
    assert r["skippedCheckpoints"] == list(skipped) and "warmStartedFrom" not in r
    assert checkpoints.from_report(r) == {"resumedFromStep": 0, "skipped": list(skipped)}


def test_a_warm_start_is_reported_and_many_skipped_files_are_cut_to_fit() -> None:
    skipped = tuple(f"step-{i:08d}.pt: contents do not match their sha256 " + "x" * 900 for i in range(50))
    facts = report.RunFacts(20, 4, 0, 1, warm_started_from="team/other", skipped_checkpoints=skipped)
    _, r = report.finished(PASSED, facts, steps=20, model_digest="abc")
    assert r["warmStartedFrom"] == "team/other" and len(r["skippedCheckpoints"]) == 50
    text = report.termination_message(r | {"message": "m" * 3000})
    cut = json.loads(text)
    assert len(text.encode()) < 4096 and cut["warmStartedFrom"] == "team/other"
    assert 0 < len(cut["skippedCheckpoints"]) <= report.MAX_SKIPPED
    assert all(len(s) <= report.MAX_SKIPPED_CHARS for s in cut["skippedCheckpoints"])


def test_every_failed_rank_of_a_pod_records_itself_in_the_one_report(tmp_path: Path) -> None:
    """Local rank 1 raised first (no report yet: a bare Failed one), then local rank 0 failed through the
    collective and wrote the pod's full report: both failures stay, the earliest first; a later run of the
    same pod (a restart in place) replaces the earlier run's."""
    path = str(tmp_path / "termination-log")
    report.record_failure(path, 1, "RuntimeError: injected crash", at=100.0)
    bare = contract.parse_report(Path(path).read_text())
    assert bare is not None and (bare["result"], bare["reason"]) == ("Failed", contract.COMMAND_ERROR)
    full: dict[str, Any] = {
        "result": "Failed",
        "reason": "TrainerError",
        "message": "peer closed",
        "checks": 1,
    }
    report.write_termination_message(path, full)
    report.record_failure(path, 0, "RuntimeError: Connection closed by peer", at=101.0)
    written = contract.parse_report(Path(path).read_text())
    assert written is not None and (written["reason"], written["checks"]) == ("TrainerError", 1), written
    assert [(f["rank"], f["error"]) for f in written["failures"]] == [
        (1, "RuntimeError: injected crash"),
        (0, "RuntimeError: Connection closed by peer"),
    ]
    report.record_failure(path, 3, "ValueError: later run", at=200.0, restart=1)
    later = contract.parse_report(Path(path).read_text())
    assert later is not None and [f["rank"] for f in later["failures"]] == [3], later


_STOPPED_WHILE_RECORDING = """
import contextlib, os, signal, sys
from ddp_trainer.reporting import report
path = sys.argv[1]
real = report._locked


@contextlib.contextmanager
def locked(at):  # the launcher's SIGTERM arrives just after the report was truncated, before the write
    with real(at) as file:
        class Stopped:
            def __getattr__(self, name):
                return getattr(file, name)

            def truncate(self, *size):
                done = file.truncate(*size)
                os.kill(os.getpid(), signal.SIGTERM)
                return done

        yield Stopped()


report._locked = locked
report.record_failure(path, 3, "RuntimeError: Connection closed by peer", at=101.0)
print("not stopped", flush=True)
"""


def test_a_rank_stopped_while_it_records_its_failure_leaves_the_crash_recorded(tmp_path: Path) -> None:
    """Rank 2 crashed and recorded it; rank 3, failing through the collective, is SIGTERMed by the launcher
    between truncating the pod's report and writing it back (seen in CI: the report was left empty and no
    one named the crash). The stop waits for the write, then ends the rank as a SIGTERM does."""
    import signal
    import subprocess
    import sys

    path = str(tmp_path / "termination-log")
    report.record_failure(path, 2, "RuntimeError: injected crash", at=100.0)
    done = subprocess.run(
        [sys.executable, "-c", _STOPPED_WHILE_RECORDING, path], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == -signal.SIGTERM and "not stopped" not in done.stdout, done
    written = contract.parse_report(Path(path).read_text())
    assert written is not None and [(f["rank"], f["at"]) for f in written["failures"]] == [
        (2, 100.0),
        (3, 101.0),
    ]


_WRITE = """
import json, sys
from ddp_trainer.reporting import report
path, written, times = sys.argv[1:]
for _ in range(int(times)):
    report.write_termination_message(path, json.loads(written))
"""


def _world(path: str, attempt: int, checks: int, resumed: int, times: int = 1) -> None:
    """One world's rank 0, a process of its own (as each world's workers are), writing its report."""
    import subprocess
    import sys

    tally = Tally(checks=checks, last_check_step=resumed + 8 * checks, last_check_ok=True)
    facts = report.RunFacts(step=resumed + 8 * checks, world_size=4, resumed_from=resumed, attempt=attempt)
    written = report.build(contract.INTERRUPTED, "Terminated", "stopped", tally, facts)
    cmd = [sys.executable, "-c", _WRITE, path, json.dumps(written), str(times)]
    subprocess.run(cmd, check=True)


def test_the_pods_report_carries_the_checks_of_every_world_of_its_attempt(tmp_path: Path) -> None:
    """Issue 58 item 3: a gang restart in place (or a resize) starts new worker processes whose tally starts
    at 0; the pod's report keeps what the attempt's earlier worlds reported beside this world's own count.
    A second write by one process replaces its own; another attempt's report is not carried."""
    from ddp_operator.observe import sync_report

    path = str(tmp_path / "termination-log")
    _world(
        path, attempt=1, checks=4, resumed=0
    )  # an earlier attempt's (local mode keeps one file per attempt)
    _world(path, attempt=2, checks=3, resumed=0)
    report.record_failure(path, 1, "RuntimeError: injected crash", at=100.0)  # the crash that restarts it
    _world(path, attempt=2, checks=2, resumed=24, times=2)
    _world(path, attempt=2, checks=3, resumed=40)
    final = contract.parse_report(Path(path).read_text())
    assert final is not None and final["checks"] == 3 and final["resumedFromStep"] == 40
    assert final[contract.REPORT_EARLIER_WORLDS] == {  # type: ignore[literal-required]
        "worlds": 2,
        "checks": 5,
        "mismatches": 0,
        "repairs": 0,
        "resumedFromStep": 0,
    }
    assert sync_report.attempt_checks(final, 2) == {
        "attempt": 2,
        "checks": 8,
        "mismatches": 0,
        "repairs": 0,
        "worlds": 3,
        "resumedFromStep": 0,
    }
