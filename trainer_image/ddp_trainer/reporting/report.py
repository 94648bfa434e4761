"""The final report and exit code of a run, and the small JSON object for the Kubernetes termination
message (< 4096 bytes).

The keys are :class:`ddp_trainer.contract.Report`: the operator reads them back with
:func:`ddp_trainer.contract.parse_report`. The functions that build a report are pure: the sync tally
and a few facts about the run in, ``(exit code, report)`` out.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ddp_trainer import contract
from ddp_trainer.contract import REPORT_LIMIT as LIMIT
from ddp_trainer.reporting import worlds
from ddp_trainer.reporting.inputs import ProbeFinding, SyncTally

log = logging.getLogger(__name__)

MAX_TENSOR_NAMES = 16
MAX_SKIPPED = 8
MAX_SKIPPED_CHARS = 300


@dataclass(frozen=True)
class RunFacts:
    """What a report states about the run beside the sync tally."""

    step: int
    """Optimizer steps done."""
    world_size: int
    """Processes in the job."""
    resumed_from: int
    """The checkpoint step this attempt resumed from (0: a fresh start)."""
    attempt: int
    """``DDPJOB_ATTEMPT``."""
    warm_started_from: str = ""
    """``namespace/name`` of the DDPJob whose weights seeded a warm start ("" when there was none)."""
    skipped_checkpoints: tuple[str, ...] = ()
    """Checkpoint files passed over at restore, each ``<file>: <why>``."""
    restarts_in_place: int = 0
    """Gang restarts done in place in this attempt before this run (the launcher's count)."""
    last_restart: str = ""
    """Why the last of them happened."""
    last_restart_from: str = contract.RESTART_FROM_CHECKPOINT
    """Where its workers took their state from (``contract.RESTART_FROM``)."""


def build(
    result: contract.Result, reason: str, message: str, tally: SyncTally, facts: RunFacts
) -> contract.Report:
    """The report of a run that got as far as counting checks."""
    report: contract.Report = {
        "result": result,
        "reason": reason,
        "message": message,
        "verified": tally.verified,
        "checks": tally.checks,
        "mismatches": tally.mismatches,
        "repairs": tally.repairs,
        "lastCheckStep": max(tally.last_check_step, 0),
        "step": facts.step,
        "worldSize": facts.world_size,
        "mismatchedTensors": tally.mismatched_tensors,
        "divergedRanks": tally.diverged_ranks,
        "maxAbsDiff": tally.max_abs_diff,
        "resumedFromStep": facts.resumed_from,
        "attempt": facts.attempt,
    }
    if facts.warm_started_from:
        report["warmStartedFrom"] = facts.warm_started_from
    if facts.skipped_checkpoints:
        report["skippedCheckpoints"] = list(facts.skipped_checkpoints)
    if facts.restarts_in_place:
        report[contract.REPORT_RESTARTS_IN_PLACE] = facts.restarts_in_place
        report[contract.REPORT_LAST_RESTART] = facts.last_restart[:512]
        report[contract.REPORT_LAST_RESTART_FROM] = facts.last_restart_from
    return report


def finished(tally: SyncTally, facts: RunFacts, steps: int, model_digest: str) -> tuple[int, contract.Report]:
    """The loop returned: trained to ``steps`` (succeeded, verified or not) or stopped by a signal."""
    if facts.step < steps:
        message = f"stopped by a signal at step {facts.step} of {steps}"
        report = build(contract.INTERRUPTED, "Terminated", message, tally, facts)
        code = contract.INTERRUPTED_EXIT_CODE
    else:
        if tally.verified:
            reason = "RepairedDivergence" if tally.repairs else "AllChecksPassed"
            message = f"{facts.step} steps, {tally.checks} sync checks"
        else:
            reason, message = (
                "DivergenceIgnored",
                f"{tally.mismatches} check(s) found divergence (policy Warn)",
            )
        report = build(contract.SUCCEEDED, reason, message, tally, facts)
        code = contract.SUCCESS_EXIT_CODE
    report["modelDigest"] = model_digest
    return code, report


def diverged(tally: SyncTally, facts: RunFacts, reason: str, message: str) -> tuple[int, contract.Report]:
    """A divergence under ``Fail``, or a ``Repair`` that did not take."""
    return contract.DIVERGENCE_EXIT_CODE, build(contract.DIVERGED, reason, message, tally, facts)


def refused(reason: str, message: str, tally: SyncTally, facts: RunFacts) -> tuple[int, contract.Report]:
    """The checkpoint volume holds another job's checkpoint, or this job's with other settings (``reason``
    :data:`contract.FOREIGN_CHECKPOINT` or :data:`contract.SETTINGS_CHANGED`): failed before step 1, with
    the exit code that tells the operator not to restart."""
    return contract.CHECKPOINT_REFUSED_EXIT_CODE, build(contract.FAILED, reason, message, tally, facts)


def faulty(found: ProbeFinding, tally: SyncTally, facts: RunFacts) -> tuple[int, contract.Report]:
    """The compute probe named faulty ranks under ``onFaultyRank: Fail``."""
    report = build(contract.FAILED, contract.FAULTY_RANK, found.message, tally, facts)
    return contract.FAULTY_RANK_EXIT_CODE, with_faulty(report, found)


def with_faulty(report: contract.Report, found: ProbeFinding) -> contract.Report:
    """``report`` naming the faulty ranks, their nodes, pods and devices (also a finished run's, under
    ``Warn``)."""
    report["faultyRanks"], report["faultyNodes"] = list(found.verdict.ranks)[:16], list(found.nodes)[:16]
    report["faultyPods"], report["faultyDevices"] = list(found.pods)[:16], list(found.devices)[:16]
    return report


def usage(message: str) -> tuple[int, contract.Report]:
    """The command line was refused (argparse's ``message``): a configuration error that no restart fixes."""
    return contract.USAGE_EXIT_CODE, {
        "result": contract.FAILED,
        "reason": contract.INVALID_ARGUMENTS,
        "message": f"the trainer's command line was refused: {message}",
    }


def failed(
    message: str,
    tally: SyncTally | None = None,
    facts: RunFacts | None = None,
    reason: str = "TrainerError",
) -> tuple[int, contract.Report]:
    """Any other error; without ``tally`` and ``facts`` (it failed before they existed), a bare report.
    ``reason``: ``TrainerError`` for the built-in trainer, :data:`contract.COMMAND_ERROR` for user code."""
    if tally is None or facts is None:
        return contract.FAILURE_EXIT_CODE, {"result": contract.FAILED, "reason": reason, "message": message}
    return contract.FAILURE_EXIT_CODE, build(contract.FAILED, reason, message, tally, facts)


def termination_message(report: Mapping[str, Any], limit: int = LIMIT) -> str:
    """``report`` as compact JSON under ``limit`` bytes: long lists and the message are cut first."""
    cut: dict[str, Any] = dict(report)  # a copy to cut down
    names = list(cut.get("mismatchedTensors", []))[:MAX_TENSOR_NAMES]
    cut["mismatchedTensors"] = names
    if "skippedCheckpoints" in cut:
        cut["skippedCheckpoints"] = [s[:MAX_SKIPPED_CHARS] for s in cut["skippedCheckpoints"][:MAX_SKIPPED]]
    cut["message"] = str(cut.get("message", ""))[:1024]
    if isinstance(cut.get("maxAbsDiff"), float) and not math.isfinite(cut["maxAbsDiff"]):
        cut["maxAbsDiff"] = str(cut["maxAbsDiff"])  # JSON has no inf/nan
    while True:
        text = json.dumps(cut, separators=(",", ":"), sort_keys=True)
        if len(text.encode()) < limit:
            return text
        if cut["mismatchedTensors"]:
            cut["mismatchedTensors"] = cut["mismatchedTensors"][:-1]
            cut["mismatchedTensorsTruncated"] = True
        elif cut.get("skippedCheckpoints"):
            cut["skippedCheckpoints"] = cut["skippedCheckpoints"][:-1]
        elif cut["message"]:
            cut["message"] = cut["message"][: len(cut["message"]) // 2]
        else:
            raise ValueError(f"report does not fit in {limit} bytes: {text[:200]}")


def write_termination_message(path: str | None, report: Mapping[str, Any]) -> None:
    """Write the report where Kubernetes looks (``path``), keeping the ``failures`` other ranks of the pod
    recorded there (:func:`record_failure`) and the checks of the attempt's earlier worlds reported there
    (:func:`ddp_trainer.reporting.worlds.carry_worlds`); a failure to write is logged, not raised."""
    if not path:
        return
    try:
        with _locked(path) as file:
            text = file.read()
            earlier = _failures_in(text)
            merged = worlds.carry_worlds(report, contract.parse_report(text), os.getpid())
            merged["failures"] = _merge(earlier, list(report.get("failures", [])))
            if not merged["failures"]:
                del merged["failures"]
            _rewrite(file, termination_message(merged))
    except OSError as err:
        log.warning("cannot write the termination message to %s: %s", path, err)


def record_failure(
    path: str | None, rank: int, error: str, at: float | None = None, restart: int = 0
) -> None:
    """Add "rank ``rank`` failed with ``error`` at ``at``" to the pod's report at ``path`` (any local rank
    may: the file is locked), so the operator can name the rank that failed first, with its own words,
    whichever rank writes the pod's report. ``restart``: the gang restarts done in place before this run
    (the failures of an earlier run in the same pod are dropped). Without a report there yet, a bare
    ``Failed`` one (:data:`contract.COMMAND_ERROR`) that the pod's local rank 0 may complete later."""
    if not path:
        return
    entry: contract.Failure = {"rank": rank, "at": round(time.time() if at is None else at, 3)}
    entry["error"], entry["restart"] = error[:MAX_FAILURE_CHARS], restart
    try:
        with _locked(path) as file:
            text = file.read()
            report: dict[str, Any] = dict(contract.parse_report(text) or {})
            if not report or report.get("result") == contract.SUCCEEDED:  # a failed rank fails the pod
                report = {"result": contract.FAILED, "reason": contract.COMMAND_ERROR, "message": error}
            report["failures"] = _merge(_failures_in(text), [entry])
            _rewrite(file, termination_message(report))
    except OSError as err:
        log.warning("cannot record the failure in %s: %s", path, err)


def write_unless_reported(path: str | None, report: Mapping[str, Any]) -> None:
    """Write ``report`` at ``path`` only where no report is there yet (another rank's failure stays)."""
    if not path:
        return
    try:
        with _locked(path) as file:
            if contract.parse_report(file.read()) is None:
                _rewrite(file, termination_message(report))
    except OSError as err:
        log.warning("cannot write the termination message to %s: %s", path, err)


MAX_FAILURE_CHARS = 300
MAX_FAILURES = 8


def _merge(*lists: list[Any]) -> list[Any]:
    """One failure per rank (the earliest) of the latest in-place restart, the earliest first, at most
    :data:`MAX_FAILURES`."""
    entries = [e for found in lists for e in found if isinstance(e, dict)]
    latest = max((e.get("restart", 0) for e in entries), default=0)
    by_rank: dict[int, Any] = {}
    for entry in (e for e in entries if e.get("restart", 0) == latest):
        rank = entry.get("rank")
        if isinstance(rank, int) and (rank not in by_rank or entry.get("at", 0) < by_rank[rank].get("at", 0)):
            by_rank[rank] = entry
    return sorted(by_rank.values(), key=lambda e: (e.get("at", 0), e["rank"]))[:MAX_FAILURES]


def _failures_in(text: str) -> list[Any]:
    found = (contract.parse_report(text) or {}).get("failures", [])
    return list(found) if isinstance(found, list) else []


@contextlib.contextmanager
def _locked(path: str) -> Iterator[Any]:
    """``path`` open for reading and writing (created if missing) under an exclusive ``flock``."""
    with open(path, "a+") as file:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX)
        try:
            file.seek(0)
            yield file
        finally:
            fcntl.flock(file.fileno(), fcntl.LOCK_UN)


def _rewrite(file: Any, text: str) -> None:
    with _termination_held():
        file.seek(0)
        file.truncate()
        file.write(text)
        file.flush()


@contextlib.contextmanager
def _termination_held() -> Iterator[None]:
    """SIGTERM held off until the block ends, then delivered as it would have been. A pod's ranks share one
    report, and the launcher SIGTERMs a pod's other ranks as soon as one fails: a rank stopped between the
    truncation and the write left the report empty, and the failure another rank had recorded in it (the
    crash itself) was lost. Only the main thread may change a signal's handler: elsewhere, nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        if pending:
            signal.raise_signal(signal.SIGTERM)
