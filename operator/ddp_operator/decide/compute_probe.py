"""The compute probe, one room of the decision: what the status says of it, and the nodes later attempts
avoid. Pure.

The trainer's compute probe (``ddp_trainer.sync.probe``) runs the same step on every rank and compares;
rank 0's report names the faulty ranks it found and its last verdict. Here:

- :func:`from_report`: ``status.probe`` after a report (:func:`finding`: the faulty ranks, the attempt, the
  message; the last verdict and why);
- :func:`faulty_rank_found`: an attempt ended on a faulty rank under ``onFaultyRank: Fail``: the
  (node, device) of each faulty rank the report names (:func:`faulty_devices`); the nodes go into
  ``status.probe.faultyNodes`` (:func:`avoid_nodes`), and the operator marks each with ``--node-health``
  (:mod:`ddp_operator.observe.nodehealth` says how);
- :func:`nodes_to_avoid`: the nodes the next attempt's pods stay off: those of ``status.probe.faultyNodes``
  (:func:`avoided_nodes`), then those whose GPUs are marked unhealthy.

:mod:`ddp_operator.decide.status` writes ``status.probe`` in every branch
(:func:`~ddp_operator.decide.status.begin`); :mod:`ddp_operator.decide.decision` calls the other two.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ddp_operator.api import typed_status
from ddp_operator.api.typed_status import Status
from ddp_operator.decide.status_builder import Section, StatusBuilder
from ddp_operator.observe.outcome import Outcome
from ddp_trainer import contract


def finding(previous: Mapping[str, Any], report: contract.Report, attempt: int) -> dict[str, Any]:
    """``status.probe`` after a report that names faulty ranks: the finding (ranks, message, attempt);
    ``faultyNodes`` (the nodes later attempts avoid) is kept as it was (:func:`avoid_nodes` adds to it)."""
    out = Section(typed_status.Probe, dict(previous))
    out.set(
        faulty_ranks=[r for r in report.get("faultyRanks") or [] if isinstance(r, int)][:16],
        attempt=attempt,
        message=str(report.get("message", ""))[:1024],
    )
    return out.values


def from_report(previous: Mapping[str, Any], report: contract.Report, attempt: int) -> dict[str, Any]:
    """``status.probe`` after a report: a finding that names faulty ranks (:func:`finding`), and the
    last probe's verdict and why (undecidable, say: the model does not reproduce itself); {} if neither."""
    found = finding(previous, report, attempt) if report.get("faultyRanks") else dict(previous)
    out = Section(typed_status.Probe, found)
    if report.get("probeVerdict") in contract.PROBE_RESULTS:
        out.set(last_verdict=report["probeVerdict"], last_why=str(report.get("probeWhy", ""))[:1024])
    return out.values


def avoided_nodes(status: Status) -> tuple[str, ...]:
    """``status.probe.faultyNodes``: where the compute probe found a faulty rank under ``Fail``."""
    return tuple(n for n in status.probe.faulty_nodes or () if n) if status.probe is not None else ()


def avoid_nodes(out: StatusBuilder, nodes: tuple[str, ...]) -> None:
    """Add ``nodes`` to ``status.probe.faultyNodes``: the next attempts' pods stay off them."""
    probe = Section(typed_status.Probe, dict(out.stored("probe", written=True) or {}))
    probe.set(faulty_nodes=list(dict.fromkeys([*avoided_nodes(out.current()), *nodes])))
    out.set(probe=probe.values)


def nodes_to_avoid(last: Status, unhealthy: Iterable[str] | None) -> list[str]:
    """Where the next attempt's pods must not run: where the compute probe found a faulty rank, then where
    GPUs are marked unhealthy (``--node-health``), each node once."""
    return list(dict.fromkeys([*avoided_nodes(last), *sorted(unhealthy or {})]))


def faulty_devices(report: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    """(node, device) of each faulty rank a report names, each node once (its first device; empty names,
    from outside a pod, left out)."""
    report = report or {}
    nodes, devices = report.get("faultyNodes") or [], report.get("faultyDevices") or []
    found: dict[str, str] = {}
    for i, node in enumerate(nodes):
        if isinstance(node, str) and node and node not in found:
            device = devices[i] if i < len(devices) and isinstance(devices[i], str) else "unknown"
            found[node] = device
    return tuple(found.items())


def faulty_rank_found(out: StatusBuilder, outcome: Outcome) -> tuple[tuple[str, str, str], ...]:
    """An attempt that ended on a faulty rank: its nodes (:func:`faulty_devices`) avoided from now on
    (``status.probe.faultyNodes``), and (node, device, why) of each, for the operator to mark
    (``Plan.mark_faulty``)."""
    found = faulty_devices(outcome.report)
    avoid_nodes(out, tuple(node for node, _ in found))
    why = (outcome.report or {}).get("message") or "the compute probe named a faulty rank"
    return tuple((node, device, why) for node, device in found)
