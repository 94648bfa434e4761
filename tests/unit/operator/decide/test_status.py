"""status: the live status.sync, the sync events, the Succeeded event and the final status.progress."""

from __future__ import annotations

import datetime as dt

from ddp_operator.decide import compute_probe, progress, restarts, status, sync_check
from ddp_operator.decide.status import StatusBuilder
from ddp_operator.decide.status_builder import stamp
from ddp_operator.observe import live
from ddp_operator.observe.metrics import Progress

T0 = 1_800_000_000.0


def _reading(step: int, samples: float, **extra: object) -> Progress:
    return Progress(step=step, samples=samples, ranks=2, **extra)  # type: ignore[arg-type]


def _answers(*texts: str | None) -> list[live.Answer]:
    return [
        live.Answer(f"job-1-{i}", text, error="" if text else "timed out") for i, text in enumerate(texts)
    ]


def test_live_sync_names_the_last_checks_step_and_verdict() -> None:
    checked = _reading(
        130, 0.0, checks_ok=3, last_check_ok=True, last_check_time=T0 - 5, last_check_step=120
    )  # the check ran at step 120; training went on to step 130
    sync = sync_check.live_sync({}, checked)
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
    assert sync_check.live_sync({}, just)["lastCheckStep"] == 130
    diverged = _reading(130, 0.0, checks_ok=2, checks_mismatch=1, last_check_ok=False, last_check_time=T0)
    assert sync_check.live_sync({}, diverged)["verified"] is False
    assert sync_check.live_sync({"checks": 9}, _reading(0, 0.0)) == {"checks": 9}


def test_events_for_the_first_good_check_a_divergence_and_a_repair() -> None:
    def events(old: dict[str, object], now: Progress) -> list[str]:
        out = StatusBuilder({"sync": old}, "2027-01-15T08:01:00Z")
        out.values["sync"] = old
        snap = live.record(None, 1, 9400, _answers("a"), T0, now)
        progress.write_reading(out, snap, 1, 1000)
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
        progress.completed_message(previous, 1, now, 600)
        == "attempt 1 completed in 3m20s: 600 steps, 1,234 samples/s"
    )
    assert progress.completed_message({}, 2, now, None) == "attempt 2 completed"
    final = progress.final_progress(previous, 600, 600, "2027-01-15T08:03:20Z")
    assert final is not None and (final["percent"], final["eta"], final["samplesPerSecond"]) == (
        100,
        "0s",
        1234.5,
    )


def test_a_job_that_built_no_ddp_model_says_so_not_that_nothing_reported() -> None:
    """The sync hook's report when no DDP model was built (reason NoDDPModel, no checks), or only an FSDP one
    (FullyShardedNoReplicas): SyncVerified is Unknown with that reason and the report's words, distinct
    from a job that wrote no report at all (NotYetReported)."""
    from ddp_operator.observe import sync_report
    from ddp_trainer import contract
    from ddp_trainer.sync import sharded

    # and FSDP over a 1-D mesh (FullyShardedNoReplicas): nothing replicated, said in words that name FSDP
    for reason, message, said in (
        (contract.NO_DDP_MODEL, contract.NO_DDP_MODEL_MESSAGE, "no DDP model was built in any rank: nothing"),
        (contract.FULLY_SHARDED, sharded.FSDP_ONLY, "FSDP shards every parameter across all ranks"),
        (
            contract.NOT_STEPPED,
            contract.NOT_STEPPED_MESSAGE,
            "a DDP model was built but no optimizer stepped",
        ),
    ):
        report = {"result": "Succeeded", "reason": reason, "message": message}
        out = StatusBuilder({}, "2026-01-01T00:00:00Z")
        out.values["sync"] = sync_check.from_report(report)
        out.values["lastReport"] = status.last_report(report, 1)
        sync_check.condition(out)
        condition = out.conditions["SyncVerified"]
        assert (condition["status"], condition["reason"], condition["message"]) == (
            "Unknown",
            reason,
            message,
        )
        assert sync_report.sync_sentence(report).startswith(said)
    silent = StatusBuilder({}, "2026-01-01T00:00:00Z")
    sync_check.condition(silent)
    assert silent.conditions["SyncVerified"]["reason"] == "NotYetReported"
    assert "callback" not in sync_report.sync_sentence(None).split("without the sync hook")[0]


def test_the_last_probe_verdict_and_why_reach_the_status_and_the_summary() -> None:
    """An undecidable probe (the model does not reproduce itself) is said in status.probe and in the sync
    sentence, without naming anyone; a faulty finding keeps its ranks beside the verdict."""
    from ddp_operator.observe import sync_report

    why = (
        "compute probe at step 100: undecidable: the model's computation does not reproduce itself on this "
        "hardware: 4 of 4 ranks gave another result when the probe was repeated"
    )
    report = {"result": "Succeeded", "verified": True, "checks": 3, "worldSize": 4, "lastCheckStep": 100}
    report |= {"probes": 1, "probeVerdict": "undecidable", "probeWhy": why}
    assert compute_probe.from_report({}, report, 2) == {"lastVerdict": "undecidable", "lastWhy": why}
    assert sync_report.sync_sentence(report).endswith(f"(last check at step 100); {why}")
    faulty = report | {"probeVerdict": "faulty", "faultyRanks": [3], "message": "rank 3 ..."}
    found = compute_probe.from_report({"faultyNodes": ["n1"]}, faulty, 2)
    assert (found["faultyRanks"], found["faultyNodes"], found["lastVerdict"]) == ([3], ["n1"], "faulty")
    assert compute_probe.from_report({}, {"result": "Succeeded"}, 1) == {}


def test_who_failed_first_survives_the_pods_deletion_in_last_report() -> None:
    """status.lastReport keeps every pod's failed ranks, so the cause is still named after the Job
    controller deleted the pods (facts.remembered_report reads it back)."""
    from ddp_operator.observe import facts, failures

    report = {"result": "Failed", "reason": "CommandError", "message": ""}
    report["failures"] = [  # type: ignore[assignment]
        {
            "rank": 0,
            "at": 12.5,
            "error": "RuntimeError: [pair.cc:561] Connection closed by peer",
            "restart": 0,
        },
        {"rank": 1, "at": 11.0, "error": "RuntimeError: injected crash on rank 1 at step 5", "restart": 0},
    ]
    kept = status.last_report(report, 3)
    assert [f["rank"] for f in kept["failures"]] == [0, 1] and kept["failures"][1]["at"] == 11.0
    back = facts.remembered_report({"lastReport": kept}, 3)
    assert back is not None
    assert failures.describe(back.get("failures") or []).startswith(
        "rank 1 failed first, in your command: RuntimeError: injected crash on rank 1 at step 5"
    )
    assert "failures" not in status.last_report({"result": "Succeeded"}, 3)


def test_a_sync_hook_that_could_not_switch_on_says_why_in_sync_verified() -> None:
    message = "the sync hook could not switch on: ImportError: x; nothing was verified"
    report = {"result": "Succeeded", "reason": "SyncHookOff", "message": message}
    out = StatusBuilder({}, "2026-01-01T00:00:00Z")
    out.values["lastReport"] = status.last_report(report, 1)
    sync_check.condition(out)
    condition = out.conditions["SyncVerified"]
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "Unknown",
        "SyncHookOff",
        message,
    )


def test_status_sync_counts_every_attempt_and_world_of_the_job() -> None:
    """Issue 58 item 3: attempt 1 reported 3 checks; attempt 2 (a new Job after a gang restart) checks on
    live, then reports 3 of its last world and 2 of the world before its restart in place: status.sync
    counts 8, per attempt in sync.attempts, and a reconcile that reads the same report again counts nothing
    twice."""
    from ddp_operator.api.spec import parse
    from ddp_trainer import contract

    spec = parse(
        {
            "apiVersion": "ddpjob.io/v1alpha1",
            "kind": "DDPJob",
            "metadata": {"name": "mingpt"},
            "spec": {"nodes": 2, "device": "cpu", "command": ["torchrun"], "args": ["main.py"]},
        }
    )
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    def report(attempt: int, checks: int, resumed: int, **extra: object) -> dict[str, object]:
        said = {"result": "Succeeded", "reason": "AllChecksPassed", "message": "", "verified": True}
        return {**said, "checks": checks, "mismatches": 0, "repairs": 0, "lastCheckStep": 48, **extra} | {
            "worldSize": 4,
            "resumedFromStep": resumed,
            "attempt": attempt,
        }

    first = status.begin(
        StatusBuilder({}, stamp(now)), 1, 1, restarts.shown(1, 0), report(1, 3, 0, result="Failed"), spec
    ).values
    assert first["sync"]["checks"] == 3
    # attempt 2 runs: the live reading of its world adds to attempt 1's
    live_now = _reading(30, 0.0, checks_ok=1, last_check_ok=True, last_check_step=30)
    assert sync_check.live_sync(first["sync"], live_now, 2)["checks"] == 4
    worlds = {"worlds": 1, "checks": 2, "mismatches": 0, "repairs": 0, "resumedFromStep": 24}
    last = report(2, 3, 40, **{contract.REPORT_EARLIER_WORLDS: worlds})
    second = status.begin(StatusBuilder(first, stamp(now)), 1, 2, restarts.shown(2, 0), last, spec)
    again = status.begin(
        StatusBuilder(second.values, stamp(now)), 1, 2, restarts.shown(2, 0), last, spec
    ).values
    for sync in (second.values["sync"], again["sync"]):
        assert (sync["checks"], sync["mismatches"], sync["repairs"], sync["verified"]) == (8, 0, 0, True)
        assert sync["attempts"] == [
            {"attempt": 1, "checks": 3, "mismatches": 0, "repairs": 0, "worlds": 1, "resumedFromStep": 0},
            {"attempt": 2, "checks": 5, "mismatches": 0, "repairs": 0, "worlds": 2, "resumedFromStep": 24},
        ]
    status.finish(second, True, "Completed", "done")
    assert (
        second.conditions["SyncVerified"]["message"]
        == "8 checks over 2 attempts found every rank bit-identical"
    )
