"""observe.metrics: what a person watching sees, from the trainer's metrics and its report."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest

from ddp_operator.observe import metrics, sync_report

METRICS_POD0 = """
ddp_steps_total{job="j",namespace="n",node_rank="0",rank="0"} 40.0
ddp_steps_total{job="j",namespace="n",node_rank="0",rank="1"} 41.0
ddp_samples_total{job="j",namespace="n",node_rank="0",rank="0"} 1280.0
ddp_samples_total{job="j",namespace="n",node_rank="0",rank="1"} 1312.0
ddp_loss{job="j",namespace="n",node_rank="0",rank="0"} 0.5
ddp_loss{job="j",namespace="n",node_rank="0",rank="1"} 0.7
ddp_sync_checks_total{job="j",kind="periodic",namespace="n",node_rank="0",rank="0",result="ok"} 2.0
ddp_sync_checks_total{job="j",kind="initial",namespace="n",node_rank="0",rank="0",result="ok"} 1.0
ddp_sync_checks_total{job="j",kind="periodic",namespace="n",node_rank="0",rank="1",result="ok"} 3.0
"""
METRICS_POD1 = """
ddp_steps_total{job="j",namespace="n",node_rank="1",rank="2"} 42.0
ddp_samples_total{job="j",namespace="n",node_rank="1",rank="2"} 1344.0
ddp_sync_checks_total{job="j",kind="periodic",namespace="n",node_rank="1",rank="2",result="mismatch"} 1.0
"""


def test_progress_from_metrics() -> None:
    now = metrics.parse([METRICS_POD0, METRICS_POD1])
    assert now == metrics.Progress(step=40, samples=3936.0, loss=0.5, checks_ok=3, checks_mismatch=0, ranks=3)
    first = metrics.Progress(samples=936.0)
    assert metrics.line(now, 200, 2.0, first) == (
        "step 40/200 (20%)  loss 0.5000  1,500 samples/s  ETA 8s  sync checks: 3 ok"
    )
    assert "1 MISMATCH" in metrics.line(metrics.parse([METRICS_POD1]), 200, 1.0)
    # steps but no samples counted, no loss (a script under the no-code hook): left out, no placeholder
    stepping = metrics.Progress(step=40, samples=0.0)
    assert metrics.line(stepping, 200, 2.0, metrics.Progress()) == (
        "step 40/200 (20%)  ETA 8s  sync checks: 0 ok"
    )
    assert metrics.line(stepping, 0, 0.0) == "step 40  sync checks: 0 ok"  # no total, no second reading


def test_sync_sentence() -> None:
    assert sync_report.sync_sentence(
        {"verified": True, "checks": 7, "worldSize": 4, "lastCheckStep": 300, "repairs": 0}
    ) == ("replicas verified bit-identical 7 times across 4 ranks (last check at step 300)")
    # a restarted or resized world counts its checks from its restore, and says so
    assert sync_report.sync_sentence(
        {"verified": True, "checks": 4, "worldSize": 3, "lastCheckStep": 300, "resumedFromStep": 250}
    ) == (
        "replicas verified bit-identical 4 times across 3 ranks since this world resumed at step 250 "
        "(last check at step 300)"
    )
    diverged = sync_report.sync_sentence(
        {
            "result": "Diverged",
            "verified": False,
            "checks": 3,
            "mismatches": 1,
            "mismatchedTensors": ["0.weight"],
            "message": "rank 1 differs",
        }
    )
    assert diverged.startswith("replicas DIVERGED: 1 of 3 checks found ranks differing (0.weight)")
    assert sync_report.sync_sentence(None).startswith("not reported")


def test_sync_sentence_says_what_happened_not_diverged() -> None:
    """A trainer that failed before any divergence (a missing model module) is no divergence."""
    failed = sync_report.sync_sentence(
        {"result": "Failed", "reason": "TrainerError", "message": "ValueError: no module nosuchpkg"}
    )
    assert "DIVERGED" not in failed
    assert failed == (
        "no verdict: the trainer failed (TrainerError: ValueError: no module nosuchpkg); "
        "no sync check had run"
    )
    assert sync_report.sync_sentence({"result": "Failed", "reason": "TrainerError", "checks": 1}).endswith(
        "; none of its 1 sync check found ranks differing"
    )


def test_sync_sentence_counts_the_repairs() -> None:
    repaired = sync_report.sync_sentence(
        {
            "result": "Succeeded",
            "verified": True,
            "checks": 5,
            "mismatches": 2,
            "repairs": 2,
            "worldSize": 4,
            "lastCheckStep": 50,
        }
    )
    assert repaired == (
        "2 of 5 checks found ranks differing across 4 ranks; 2 repair(s) re-broadcast rank 0's model, "
        "and the last check at step 50 found every rank bit-identical"
    )
    ignored = sync_report.sync_sentence(
        {"result": "Succeeded", "verified": False, "checks": 5, "mismatches": 1, "worldSize": 4}
    )
    assert ignored.startswith("replicas DIVERGED (ignored: onDivergence is Warn): 1 of 5 checks")


def test_sync_sentence_single_rank_proves_nothing() -> None:
    single = sync_report.sync_sentence(
        {"result": "Succeeded", "verified": True, "checks": 6, "worldSize": 1, "lastCheckStep": 60}
    )
    assert "bit-identical" not in single and "prove nothing" in single


# -- the operator's reading: per-rank step time, skew, sync verdict, edge cases --------------------------

L0 = 'ddpjob="j",ddpjob_namespace="n",node_rank="0"'
L1 = 'ddpjob="j",ddpjob_namespace="n",node_rank="1"'
RUNNING_POD0 = f"""
ddp_step{{{L0},rank="0"}} 120.0
ddp_steps_total{{{L0},rank="0"}} 20.0
ddp_samples_total{{{L0},rank="0"}} 640.0
ddp_loss{{{L0},rank="0"}} 0.25
ddp_step_duration_seconds_sum{{{L0},rank="0"}} 2.0
ddp_step_duration_seconds_count{{{L0},rank="0"}} 20.0
ddp_step_time_skew_ratio{{{L0},rank="0"}} 0.125
ddp_sync_last_check_timestamp_seconds{{{L0},rank="0"}} 1.7e9
ddp_sync_last_check_ok{{{L0},rank="0"}} 1.0
ddp_sync_last_check_step{{{L0},rank="0"}} 100.0
ddp_last_step_timestamp_seconds{{{L0},rank="0"}} 1.7e9
ddp_sync_checks_total{{{L0},kind="initial",rank="0",result="ok"}} 1.0
ddp_sync_checks_total{{{L0},kind="periodic",rank="0",result="ok"}} 2.0
ddp_sync_repairs_total{{{L0},rank="0"}} 0.0
"""
RUNNING_POD1 = f"""
ddp_step{{{L1},rank="1"}} 120.0
ddp_steps_total{{{L1},rank="1"}} 20.0
ddp_samples_total{{{L1},rank="1"}} 640.0
ddp_loss{{{L1},rank="1"}} 0.3
ddp_step_duration_seconds_sum{{{L1},rank="1"}} 3.0
ddp_step_duration_seconds_count{{{L1},rank="1"}} 20.0
"""


def test_the_operator_reads_step_slowest_rank_skew_and_verdict() -> None:
    now = metrics.parse([RUNNING_POD0, RUNNING_POD1])
    assert (
        now.step == 120
    )  # the optimizer step (a resumed run counts from its checkpoint), not this run's count
    assert now.loss == 0.25 and now.samples == 1280.0
    assert now.slowest() == (1, 0.15)
    assert now.skew == 0.125 and now.last_check_ok is True and now.last_check_time == 1.7e9
    assert now.checks_ok == 3 and now.steps_per_second() == 10.0 and now.last_check_step == 100


def test_slowest_rank_between_two_readings_and_after_a_rank_restarted() -> None:
    before = metrics.parse([RUNNING_POD0, RUNNING_POD1])
    later = RUNNING_POD1.replace("sum{" + L1 + ',rank="1"} 3.0', "sum{" + L1 + ',rank="1"} 3.5')
    later = later.replace("count{" + L1 + ',rank="1"} 20.0', "count{" + L1 + ',rank="1"} 30.0')
    faster = RUNNING_POD0.replace("_sum{" + L0 + ',rank="0"} 2.0', "_sum{" + L0 + ',rank="0"} 4.0')
    faster = faster.replace("_count{" + L0 + ',rank="0"} 20.0', "_count{" + L0 + ',rank="0"} 30.0')
    now = metrics.parse([faster, later])
    # Since the earlier reading rank 1 took 0.05 s a step, rank 0 0.2 s: rank 0 is the slow one now.
    assert metrics.slowest(now, before) == (0, 0.2)
    # A histogram that went backwards (the rank restarted): its whole life counts.
    restarted = metrics.parse(
        [RUNNING_POD0.replace("count{" + L0 + ',rank="0"} 20.0', "count{" + L0 + ',rank="0"} 5.0')]
    )
    assert metrics.slowest(restarted, before) == (0, 0.4)


def test_missing_counters_nan_loss_and_no_metrics() -> None:
    assert metrics.parse([]) == metrics.Progress()
    assert metrics.parse([""]).slowest() is None
    bare = metrics.parse([f'ddp_loss{{{L0},rank="0"}} NaN\n'])
    assert bare.loss is None and bare.step == 0 and bare.steps_per_second() is None
    assert bare.last_check_ok is None and bare.skew is None and bare.last_check_time is None
    assert bare.last_check_step is None
    # Gauges initialised at 0 and never set are no time.
    zero = metrics.parse([f'ddp_sync_last_check_timestamp_seconds{{{L0},rank="0"}} 0.0\n'])
    assert zero.last_check_time is None


def test_fetch_refuses_what_is_too_large(tmp_path: Any) -> None:
    big = tmp_path / "metrics"
    big.write_bytes(b"x" * 2048)
    assert metrics.fetch(big.as_uri(), limit=4096) == "x" * 2048
    with pytest.raises(OSError, match="more than 1024 bytes"):
        metrics.fetch(big.as_uri(), limit=1024)


def test_a_port_that_answers_but_not_in_http_is_nothing_answering() -> None:
    """Another process on a pod's metrics port (two `ddpjob local` runs on one host; a port reused) answers
    with bytes that are not HTTP: the scrape says nothing answers, as for a closed port, and never raises
    (``http.client.BadStatusLine`` ended a whole `ddpjob local` run in the full run of 2026-12-05 10:46)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        port = server.getsockname()[1]

        def answer_garbage() -> None:
            for _ in range(2):
                conn, _ = server.accept()
                with conn:
                    conn.recv(1024)
                    conn.sendall(b"\x00\x01not http\r\n")

        thread = threading.Thread(target=answer_garbage, daemon=True)
        thread.start()
        with pytest.raises(OSError, match="answered, but not in HTTP: BadStatusLine"):
            metrics.fetch(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert metrics.scrape(port, timeout=5) is None
        thread.join(5)


def test_the_codes_own_total_wins_over_the_spec() -> None:
    labels = 'ddpjob="j",ddpjob_namespace="n",rank="0",node_rank="0"'
    text = (
        f"# TYPE ddp_step gauge\nddp_step{{{labels}}} 5.0\n"
        f"# TYPE ddp_total_steps gauge\nddp_total_steps{{{labels}}} 40.0\n"
    )
    now = metrics.parse([text])
    assert now.total_steps == 40 and now.total(1000) == 40
    assert metrics.line(now, 1000, 0.0).startswith("step 5/40 (12%)")
    unknown = metrics.parse([text.replace("40.0", "0.0")])
    assert unknown.total_steps is None and unknown.total(1000) == 1000


def _attempt_report(attempt: int, checks: int, resumed: int, earlier: dict[str, int] | None = None) -> Any:
    out: dict[str, Any] = {
        "result": "Succeeded" if attempt == 2 else "Interrupted",
        "verified": True,
        "checks": checks,
        "mismatches": 0,
        "repairs": 0,
        "lastCheckStep": 48 if attempt == 2 else 16,
        "worldSize": 4,
        "resumedFromStep": resumed,
        "attempt": attempt,
    }
    if earlier:
        out["earlierWorlds"] = earlier
    return out


def test_the_summary_counts_the_checks_of_every_attempt_and_says_where_each_resumed() -> None:
    """Issue 58 item 3: a gang restart (a new attempt) no longer forgets attempt 1's checks: 3 there, 5 in
    attempt 2, which resumed at step 24."""
    first, second = _attempt_report(1, 3, 0), _attempt_report(2, 5, 24)
    attempts = sync_report.with_attempt(
        sync_report.with_attempt([], sync_report.attempt_checks(first, 1)), None
    )
    attempts = sync_report.with_attempt(attempts, sync_report.attempt_checks(second, 2))
    assert sync_report.job_checks(attempts) == {"checks": 8, "mismatches": 0, "repairs": 0}
    assert sync_report.sync_sentence(second, attempts) == (
        "replicas verified bit-identical 8 times across 4 ranks in 2 attempts (attempt 2 resumed at step 24; "
        "last check at step 48)"
    )
    assert sync_report.sync_sentence(second) == (  # without the attempts: the one report's world, as before
        "replicas verified bit-identical 5 times across 4 ranks since this world resumed at step 24 "
        "(last check at step 48)"
    )


def test_the_summary_counts_the_worlds_of_one_attempt_that_restarted_in_place() -> None:
    """One attempt, three worlds (two gang restarts in place): the report's 3 checks and the 5 its earlier
    worlds reported."""
    last = _attempt_report(2, 3, 40, {"worlds": 2, "checks": 5, "mismatches": 0, "repairs": 0})
    attempts = sync_report.with_attempt([], sync_report.attempt_checks(last, 2))
    assert attempts == [
        {"attempt": 2, "checks": 8, "mismatches": 0, "repairs": 0, "worlds": 3, "resumedFromStep": 0}
    ]
    assert sync_report.sync_sentence(last, attempts) == (
        "replicas verified bit-identical 8 times across 4 ranks in 3 worlds of one attempt (gang restarts "
        "in place or resizes) (last check at step 48)"
    )


def test_attempts_beyond_the_kept_ones_are_added_into_the_oldest() -> None:
    attempts: list[dict[str, int]] = []
    for attempt in range(1, sync_report.MAX_ATTEMPTS + 3):
        attempts = sync_report.with_attempt(
            attempts, sync_report.attempt_checks(_attempt_report(attempt, 2, 0), attempt)
        )
    assert len(attempts) == sync_report.MAX_ATTEMPTS
    assert attempts[0]["checks"] == 6 and attempts[0]["worlds"] == 3
    assert sync_report.job_checks(attempts)["checks"] == 2 * (sync_report.MAX_ATTEMPTS + 2)
