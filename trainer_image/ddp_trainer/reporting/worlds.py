"""An attempt's sync checks over its worlds, in the pod's report: a gang restart in place or an elastic
resize starts new worker processes, whose tally starts at 0, so the report a world writes keeps what the
attempt's earlier worlds reported in the same file (:data:`ddp_trainer.contract.REPORT_EARLIER_WORLDS`),
and the operator and ``ddpjob local`` count the whole attempt. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddp_trainer import contract


def carry_worlds(report: Mapping[str, Any], there: Mapping[str, Any] | None, writer: int) -> dict[str, Any]:
    """``report``, written by the process ``writer``, with the checks of the attempt's earlier worlds in
    this pod: those ``there`` (the pod's report so far) carried, and ``there``'s own when another process
    of the same attempt wrote it (a world before a gang restart in place or an elastic resize; each world's
    workers are new processes). Pure."""
    out: dict[str, Any] = {**report, contract.REPORT_WRITER: writer}
    out.pop(contract.REPORT_EARLIER_WORLDS, None)
    if "checks" not in report or not there or there.get("attempt") != report.get("attempt"):
        return out
    carried = there.get(contract.REPORT_EARLIER_WORLDS)
    if there.get(contract.REPORT_WRITER) != writer and "checks" in there:  # an earlier world's report
        carried = _add_world(carried, there)
    if isinstance(carried, Mapping) and carried.get("worlds"):
        out[contract.REPORT_EARLIER_WORLDS] = dict(carried)
    return out


def _add_world(earlier: Any, world: Mapping[str, Any]) -> contract.EarlierWorlds:
    """``earlier`` worlds' counts and one more ``world``'s report, added up."""
    base: Mapping[str, Any] = earlier if isinstance(earlier, Mapping) else {}

    def number(source: Mapping[str, Any], key: str) -> int:
        value = source.get(key, 0)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    first = base if number(base, "worlds") else world
    return {
        "worlds": number(base, "worlds") + 1,
        "checks": number(base, "checks") + number(world, "checks"),
        "mismatches": number(base, "mismatches") + number(world, "mismatches"),
        "repairs": number(base, "repairs") + number(world, "repairs"),
        "resumedFromStep": number(first, "resumedFromStep"),
    }
