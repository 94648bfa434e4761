"""The sync report, read: the checks of the whole job (every attempt, every world, as
``status.sync.attempts`` keeps them) and the report in one sentence a person reads at a glance
(``ddpjob local``'s summary). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddp_operator.observe import failures
from ddp_trainer import contract

# -- the checks of the whole job: every attempt, every world -------------------------------------------

MAX_ATTEMPTS = 16
"""Attempts whose checks are kept one by one (``status.sync.attempts``); older ones are added up into the
oldest kept."""


def attempt_checks(report: Mapping[str, Any] | None, attempt: int) -> dict[str, int] | None:
    """The sync checks of ``attempt`` that its report tells: its last world's (``checks``) and its earlier
    worlds' (:data:`contract.REPORT_EARLIER_WORLDS`: gang restarts in place, elastic resizes); with the
    step the attempt resumed at. None without a report of that attempt that counts checks."""
    if not report or "checks" not in report or report.get("attempt", attempt) != attempt:
        return None
    said = report.get(contract.REPORT_EARLIER_WORLDS)
    earlier: Mapping[str, Any] = said if isinstance(said, Mapping) else {}
    worlds = _number(earlier.get("worlds"))
    return {
        "attempt": attempt,
        "checks": _number(report.get("checks")) + _number(earlier.get("checks")),
        "mismatches": _number(report.get("mismatches")) + _number(earlier.get("mismatches")),
        "repairs": _number(report.get("repairs")) + _number(earlier.get("repairs")),
        "worlds": worlds + 1,
        "resumedFromStep": _number((earlier if worlds else report).get("resumedFromStep")),
    }


def with_attempt(attempts: Any, entry: Mapping[str, int] | None) -> list[dict[str, int]]:
    """``attempts`` (as :func:`attempt_checks` gives them, oldest first) with ``entry`` in place of what
    they held of its attempt (a later report of an attempt tells more, never less); at most
    :data:`MAX_ATTEMPTS`, the oldest added up into one."""
    kept = [dict(a) for a in (attempts if isinstance(attempts, list) else []) if isinstance(a, Mapping)]
    if entry is not None:
        kept = [a for a in kept if a.get("attempt") != entry["attempt"]] + [dict(entry)]
    kept.sort(key=lambda a: _number(a.get("attempt")))
    while len(kept) > MAX_ATTEMPTS:
        first, second = kept[0], kept[1]
        kept[1] = {
            **second,
            **{
                k: _number(first.get(k)) + _number(second.get(k)) for k in ("checks", "mismatches", "repairs")
            },
            "worlds": _number(first.get("worlds")) + _number(second.get("worlds")),
            "resumedFromStep": _number(first.get("resumedFromStep")),
            "attempt": _number(first.get("attempt")),
        }
        del kept[0]
    return kept


def job_checks(attempts: Any) -> dict[str, int]:
    """Checks, mismatches and repairs over every attempt of ``attempts``."""
    kept = [a for a in (attempts if isinstance(attempts, list) else []) if isinstance(a, Mapping)]
    return {key: sum(_number(a.get(key)) for a in kept) for key in ("checks", "mismatches", "repairs")}


def _number(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _over_the_job(attempts: list[dict[str, int]]) -> tuple[str, str]:
    """What the job's count spans, where it spans more than one world (`` in 2 attempts``, `` in 3 worlds
    of one attempt ...``), and where each attempt resumed (``attempt 2 resumed at step 24``)."""
    worlds = sum(max(1, _number(a.get("worlds"))) for a in attempts)
    if len(attempts) > 1:
        span = f" in {len(attempts)} attempts"
        if worlds > len(attempts):
            span += f", {worlds} worlds"
    elif worlds > 1:
        span = f" in {worlds} worlds of one attempt (gang restarts in place or resizes)"
    else:
        return "", ""
    resumed = [
        f"attempt {a['attempt']} resumed at step {a['resumedFromStep']}"
        for a in attempts
        if _number(a.get("resumedFromStep"))
    ]
    return span, "; ".join(resumed)


def sync_sentence(report: Mapping[str, Any] | None, attempts: Any = None) -> str:
    """The sync report in one sentence a person reads at a glance, then what the compute probe concluded
    last and why, where it ran. ``attempts`` (:func:`with_attempt`): the checks of every attempt so far;
    the counts are then the whole job's, every attempt and world, where it had more than one."""
    kept = with_attempt(attempts, None)
    if report and kept and (len(kept) > 1 or _number(kept[0].get("worlds")) > 1):
        report = {**report, **job_checks(kept), "resumedFromStep": 0, _SPAN: _over_the_job(kept)}
    elif report:
        report = {**report, _SPAN: ("", "")}
    sentence = _replica_sentence(report)
    if report and report.get("probeVerdict"):
        sentence += f"; {report.get('probeWhy') or report['probeVerdict']}"
    return sentence


_SPAN = "_span"  # sync_sentence's own key: what the job's counts span, where attempts resumed (no report's)


def _replica_sentence(report: Mapping[str, Any] | None) -> str:
    """What the replica checks said: what happened, not a guess. "Diverged" only for a divergence; a
    repaired run says how many mismatches it repaired; a single rank says that its checks compare nothing."""
    if not report:
        return (
            "not reported (no rank wrote a sync report: the command stopped before it wrote one, or it ran "
            "without the sync hook (spec.syncCheck.autoInstrument: false, or a command that is not Python) "
            "and without ddp_trainer's SyncHealth or a callback; see docs/your-code.md)"
        )
    if report.get("reason") == contract.SYNC_HOOK_OFF:
        return f"not checked: {report.get('message', '')}"
    if report.get("reason") == contract.NO_DDP_MODEL:
        return contract.NO_DDP_MODEL_MESSAGE + " (the sync hook saw no DistributedDataParallel model built)"
    if report.get("reason") in (contract.FULLY_SHARDED, contract.NOT_STEPPED):
        return str(report.get("message", ""))
    checks, ranks = report.get("checks", 0), report.get("worldSize", "?")
    mismatches, repairs = report.get("mismatches", 0), report.get("repairs", 0)
    result, reason = report.get("result"), report.get("reason", "")
    last = f"last check at step {report.get('lastCheckStep')}"
    if result == contract.FAILED:
        if mismatches:
            seen = f"{mismatches} of {checks} sync checks found ranks differing"
        elif checks:
            seen = f"none of its {checks} sync check{'s' if checks > 1 else ''} found ranks differing"
        else:
            seen = "no sync check had run"
        first, rest = failures.first_failure(report.get("failures") or [])
        if first is not None:
            who = failures.culprit(first, failures.same_error(first, rest))
            return f"no verdict: your command failed on {who} ({first.get('error', '')}); {seen}"
        if reason == contract.COMMAND_ERROR:
            return f"no verdict: your command failed ({report.get('message', '')}); {seen}"
        return f"no verdict: the trainer failed ({reason}: {report.get('message', '')}); {seen}"
    if ranks == 1:
        return (
            f"a single rank: its {checks} sync checks had no other replica to compare with, so they prove "
            "nothing about replicas agreeing (run 2 or more ranks for that)"
        )
    if result == contract.DIVERGED or (mismatches and not report.get("verified")):
        tensors = ", ".join(report.get("mismatchedTensors", [])[:5]) or "unknown tensors"
        ignored = " (ignored: onDivergence is Warn)" if result == contract.SUCCEEDED else ""
        return (
            f"replicas DIVERGED{ignored}: {mismatches} of {checks} checks found ranks differing "
            f"({tensors}); {report.get('message', '')}"
        )
    so_far = " so far (interrupted)" if result == contract.INTERRUPTED else ""
    span, resumed = report.get(_SPAN) or ("", "")
    if repairs:
        return (
            f"{mismatches} of {checks} checks found ranks differing across {ranks} ranks{span}; {repairs} "
            f"repair(s) re-broadcast rank 0's model, and the {last} found every rank bit-identical{so_far}"
        )
    layout = f"; {report['sharding']}" if report.get("sharding") else ""
    # a restart or a resize starts a new world whose tally starts at its restore: say which span it covers
    since = (
        f" since this world resumed at step {report['resumedFromStep']}"
        if report.get("resumedFromStep")
        else ""
    )
    return (
        f"replicas verified bit-identical {checks} times across {ranks} ranks{span}{since}{so_far} "
        f"({resumed + '; ' if resumed else ''}{last}{layout})"
    )
