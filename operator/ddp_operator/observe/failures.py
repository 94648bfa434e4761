"""Which rank failed first, and what its peers' errors were: the cause of a failed attempt, named. Pure.

Every rank of a user's command that ends with an exception records it, with the time, in its pod's report
(``ddp_trainer.reporting.report.record_failure``, done by the no-code hook). When one rank raises, its peers
fail a moment later in their next collective ("Connection closed by peer", a gloo or NCCL timeout): those are
consequences. The cause is the earliest failure that is not such a consequence (the earliest of all when every
one is), across every pod of the attempt.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ddp_trainer import contract

CONSEQUENCE_CHARS = 120
"""Characters kept of the consequences' error (the cause's is kept whole, as recorded)."""
_SOURCE = re.compile(r"\[[^\]]*\.(?:cc|cpp|h|hpp|py):\d+\]\s*")  # gloo's "[.../pair.cc:561] "


def is_consequence(error: str) -> bool:
    """Whether ``error`` is one a rank gets because a peer died, seen through a collective."""
    low = error.lower()
    return any(word.lower() in low for word in contract.COLLATERAL_ERRORS)


def gather(reports: Iterable[Mapping[str, Any] | None]) -> list[dict[str, Any]]:
    """The failures every pod's report recorded, one per rank (the earliest), the earliest first."""
    by_rank: dict[int, dict[str, Any]] = {}
    for report in reports:
        for entry in (report or {}).get("failures", []) or []:
            if not isinstance(entry, Mapping) or not isinstance(entry.get("rank"), int):
                continue
            rank = entry["rank"]
            if rank not in by_rank or _at(entry) < _at(by_rank[rank]):
                by_rank[rank] = dict(entry)
    return sorted(by_rank.values(), key=lambda e: (_at(e), e["rank"]))


def first_failure(
    failures: Sequence[Mapping[str, Any]],
) -> tuple[Mapping[str, Any] | None, list[Mapping[str, Any]]]:
    """The failure that caused the others, and the others (the earliest first): the earliest rank's own
    error wins over any peer's collective error, whatever their times; among equals, the earliest."""
    if not failures:
        return None, []
    ordered = sorted(failures, key=lambda e: (is_consequence(str(e.get("error", ""))), _at(e), e["rank"]))
    first = ordered[0]
    return first, sorted(ordered[1:], key=lambda e: (_at(e), e["rank"]))


def describe(failures: Sequence[Mapping[str, Any]]) -> str:
    """``rank 1 failed first, in your command: RuntimeError: ...; then ranks 0, 2, 3 failed as a
    consequence (RuntimeError: Connection closed by peer ...)``, or, when several ranks raised the same
    error on their own, ``ranks 0–3 all failed in your command, rank 3 first: FileNotFoundError: ...``
    (the first by the time each recorded); ``""`` without failures."""
    first, rest = first_failure(failures)
    if first is None:
        return ""
    error = str(first.get("error", ""))
    same = same_error(first, rest)
    others = [e for e in rest if e not in same and not is_consequence(str(e.get("error", "")))]
    consequences = [e for e in rest if e not in same and e not in others]
    if error.startswith(contract.SILENT_PEER):  # the launcher stopped it: nothing of the user's failed
        text = f"rank {first['rank']} was stopped because {error}"
    elif same:  # every one of them raised it on its own: none failed because of another
        text = f"ranks {ranks([first, *same])} all failed in your command, {who_first(first, same)}: {error}"
    else:
        text = f"rank {first['rank']} failed first, in your command: {error}"
    for group, how in ((others, "on their own"), (consequences, "as a consequence")):
        if group:
            word = "rank" if len(group) == 1 else "ranks"
            said = short(str(group[0].get("error", "")))
            text += f"; then {word} {ranks(group)} failed {how} ({said})"
    return text


def culprit(first: Mapping[str, Any], same: Sequence[Mapping[str, Any]]) -> str:
    """Who failed: ``rank 1``, or, with ``same`` (other ranks that raised the same error on their own),
    ``ranks 0–3, rank 3 first`` (:func:`who_first`)."""
    return f"ranks {ranks([first, *same])}, {who_first(first, same)}" if same else f"rank {first['rank']}"


def who_first(first: Mapping[str, Any], same: Sequence[Mapping[str, Any]]) -> str:
    """``rank 3 first`` when ``first`` recorded its failure before every one of ``same``, by the time each
    recorded; ``at the same moment`` when none was first (equal or unknown times)."""
    if same and _at(first) < min(_at(e) for e in same):
        return f"rank {first['rank']} first"
    return "at the same moment"


def same_error(first: Mapping[str, Any], rest: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The ranks of ``rest`` that raised ``first``'s own error on their own (not a peer's consequence)."""
    error = str(first.get("error", ""))
    return [e for e in rest if str(e.get("error", "")) == error and not is_consequence(error)]


def ranks(failures: Sequence[Mapping[str, Any]]) -> str:
    """The failures' ranks, runs of consecutive ones as ``0–3``: ``0–3, 6``."""
    runs: list[list[int]] = []
    for n in sorted({int(e["rank"]) for e in failures}):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}–{b}" if b > a + 1 else f"{a}, {b}" for a, b in runs)


def short(error: str) -> str:
    """A peer's collective error without the C++ source location, cut to :data:`CONSEQUENCE_CHARS`."""
    text = _SOURCE.sub("", error).strip()
    return text if len(text) <= CONSEQUENCE_CHARS else text[: CONSEQUENCE_CHARS - 1] + "…"


def with_failures(
    report: Mapping[str, Any] | None, reports: Iterable[Mapping[str, Any] | None]
) -> Mapping[str, Any] | None:
    """Rank 0's ``report`` with ``failures`` gathered from every pod's report (``reports``)."""
    found = gather(reports)
    if not found:
        return report
    merged = dict(report or {"result": contract.FAILED, "reason": contract.COMMAND_ERROR, "message": ""})
    merged["failures"] = found
    return merged


def _at(entry: Mapping[str, Any]) -> float:
    at = entry.get("at")
    return float(at) if isinstance(at, int | float) else float("inf")
