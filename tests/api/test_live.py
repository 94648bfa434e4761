"""live: a running job's metrics → status.progress, live status.sync and events; ETA, rates, restarts."""

from __future__ import annotations

import datetime as dt

from ddp_operator import live, progress
from ddp_operator.plan import StatusBuilder
from ddp_operator.progress import Progress

T0 = 1_800_000_000.0


def _reading(step: int, samples: float, **extra: object) -> Progress:
    return Progress(step=step, samples=samples, ranks=2, **extra)  # type: ignore[arg-type]


def _answers(*texts: str | None, refused: bool = False) -> list[live.Answer]:
    return [
        live.Answer(f"job-1-{i}", text, refused=refused and text is None, error="" if text else "timed out")
        for i, text in enumerate(texts)
    ]


def test_eta_and_throughput_come_from_two_readings() -> None:
    first = live.record(None, 1, 9400, _answers("a", "b"), T0, _reading(100, 3200.0))
    second = live.record(first, 1, 9400, _answers("a", "b"), T0 + 10, _reading(150, 4800.0))
    assert live.rates(second) == (5.0, 160.0)
    status = live.progress_status(second, 1000)
    assert status["step"] == 150 and status["percent"] == 15 and status["summary"] == "15%"
    assert status["samplesPerSecond"] == 160.0 and status["etaSeconds"] == 170 and status["eta"] == "2m50s"
    assert status["etaTime"] == "2027-01-15T08:03:00Z" and status["computedAt"] == "2027-01-15T08:00:10Z"
    assert "unreachable" not in status


def test_before_two_readings_the_step_time_histogram_gives_the_rate() -> None:
    only = live.record(
        None,
        1,
        9400,
        _answers("a"),
        T0,
        _reading(20, 1280.0, step_times={"0": (2.0, 20.0), "1": (3.0, 20.0)}),
    )
    assert live.rates(only) == (10.0, 640.0)
    status = live.progress_status(only, 220)
    assert (status["etaSeconds"], status["slowestRank"], status["slowestStepSeconds"]) == (20, 1, 0.15)


def test_a_restart_inside_the_attempt_resets_the_rate_and_a_new_attempt_starts_over() -> None:
    first = live.record(None, 1, 9400, _answers("a"), T0, _reading(100, 3200.0))
    reset = live.record(first, 1, 9400, _answers("a"), T0 + 10, _reading(3, 96.0))
    assert reset.earlier is None and live.rates(reset) == (None, None)
    assert "etaSeconds" not in live.progress_status(reset, 1000)
    other = live.record(first, 2, 9400, _answers("a"), T0 + 10, _reading(120, 640.0))
    assert other.earlier is None


def test_the_rate_window_moves() -> None:
    snap = live.record(None, 1, 9400, _answers("a"), T0, _reading(0, 0.0))
    for i in range(1, 9):
        snap = live.record(snap, 1, 9400, _answers("a"), T0 + 10 * i, _reading(10 * i, 0.0))
    assert T0 + 10 <= snap.earlier_at < snap.at and snap.at - snap.earlier_at <= live.RATE_WINDOW_SECONDS


def test_pods_that_do_not_answer_are_named() -> None:
    snap = live.record(None, 1, 9400, _answers("text", None), T0, _reading(5, 10.0))
    assert snap.unreachable == ("job-1-1: timed out",)
    assert live.progress_status(snap, 10)["unreachable"] == ["job-1-1"]
    none = live.record(None, 1, 9400, _answers(None, None, refused=True), T0, None)
    assert none.refused == ("job-1-0", "job-1-1") and live.progress_status(none, 10).keys() == {
        "computedAt",
        "unreachable",
    }


def test_durations_fit_a_column() -> None:
    assert [progress.duration(s) for s in (0, 45.4, 200, 3720, -5)] == ["0s", "45s", "3m20s", "1h02m", "0s"]


def test_live_sync_names_the_last_checks_step_and_verdict() -> None:
    checked = _reading(
        130, 0.0, checks_ok=3, last_check_ok=True, last_check_time=T0 - 5, last_check_step=120
    )  # the check ran at step 120; training went on to step 130
    sync = live.sync_status({}, checked)
    assert sync == {
        "checks": 3,
        "mismatches": 0,
        "repairs": 0,
        "lastCheckResult": "BitIdentical",
        "verified": True,
        "lastCheckStep": 120,
        "lastCheckTime": "2027-01-15T07:59:55Z",
    }
    just = _reading(130, 0.0, checks_ok=3, last_check_ok=True, last_check_time=T0, last_check_step=130)
    assert live.sync_status({}, just)["lastCheckStep"] == 130
    diverged = _reading(130, 0.0, checks_ok=2, checks_mismatch=1, last_check_ok=False, last_check_time=T0)
    assert live.sync_status({}, diverged)["verified"] is False
    assert live.sync_status({"checks": 9}, _reading(0, 0.0)) == {"checks": 9}


def test_events_for_the_first_good_check_a_divergence_and_a_repair() -> None:
    def events(old: dict[str, object], now: Progress) -> list[str]:
        out = StatusBuilder({"sync": old}, "2027-01-15T08:01:00Z")
        out.values["sync"] = old
        snap = live.record(None, 1, 9400, _answers("a"), T0, now)
        live.update(out, snap, 1, 1000)
        return [f"{e.type} {e.reason}: {e.message}" for e in out.events]

    first = _reading(50, 0.0, checks_ok=1, last_check_ok=True, last_check_time=T0)
    assert events({}, first) == [
        "Normal SyncVerified: first sync check passed: every rank holds a bit-identical model (step 50)"
    ]
    assert events({"checks": 1, "mismatches": 0}, first) == []
    caught = _reading(
        9,
        0.0,
        checks_ok=1,
        checks_mismatch=1,
        last_check_ok=False,
        last_check_time=T0,
        mismatched_tensors=2,
        max_abs_diff=0.5,
    )
    assert events({"checks": 1, "mismatches": 0}, caught) == [
        "Warning SyncDivergence: the sync check at step 9 found 2 tensor(s) differing between ranks, "
        "max |difference| 0.5 (the final report names them)"
    ]
    bad = _reading(
        100,
        0.0,
        checks_ok=1,
        checks_mismatch=1,
        repairs=1,
        last_check_ok=True,
        last_check_time=T0,
        mismatched_tensors=2,
        max_abs_diff=0.5,
    )
    assert events({"checks": 1, "mismatches": 0, "repairs": 0}, bad) == [
        "Warning SyncDivergence: 1 sync check(s) found ranks differing since the last reading; "
        "the last check, at step 100, passed",
        "Normal SyncRepaired: re-broadcast rank 0's model after a divergence (1 repair(s) so far)",
    ]


def test_the_succeeded_event_says_time_and_throughput() -> None:
    previous = {"startTime": "2027-01-15T08:00:00Z", "progress": {"samplesPerSecond": 1234.5}}
    now = dt.datetime(2027, 1, 15, 8, 3, 20, tzinfo=dt.UTC)
    assert (
        live.completed_message(previous, 1, now, 600)
        == "attempt 1 completed in 3m20s: 600 steps, 1,234 samples/s"
    )
    assert live.completed_message({}, 2, now, None) == "attempt 2 completed"
    final = live.final_progress(previous, 600, 600, "2027-01-15T08:03:20Z")
    assert final is not None and (final["percent"], final["eta"], final["samplesPerSecond"]) == (
        100,
        "0s",
        1234.5,
    )
