"""Bad GPUs kept out, for every job (opt-in: ``ddpjob operator --node-health``, the chart's
``nodeHealth.enabled``). Pure: what a node's taints and conditions say of its GPUs, and what the operator
writes on a node where the compute probe found a faulty rank. The I/O is :mod:`ddp_operator.runtime.nodes`.

Two directions:

* **Out:** a ``faulty`` verdict under ``onFaultyRank: Fail`` taints the rank's node
  ``ddpjob.io/faulty-gpu=<device>:NoSchedule`` (the device as the trainer names it: a GPU's UUID, or
  ``cpu``), sets the Node condition ``DDPJobFaultyGPU`` and posts an Event on the Node. No DDPJob lands there
  again until a person removes the taint (docs/operator.md, "Bad GPUs kept out").
* **In:** the pods of every new attempt keep off nodes whose taints or conditions mark GPUs unhealthy:
  :data:`DEFAULT_TAINTS` (ours, NVSentinel's) and :data:`DEFAULT_CONDITIONS` (EKS's node monitoring agent,
  NVSentinel's), or the lists given. A ``NoSchedule`` taint keeps off only the pods that do not tolerate it;
  a pod template that tolerates everything (``operator: Exists``) or a condition, which the scheduler never
  reads, need the operator's node affinity (:func:`ddp_operator.children.render.avoiding`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

FAULTY_TAINT = "ddpjob.io/faulty-gpu"
FAULTY_CONDITION = "DDPJobFaultyGPU"
FAULTY_REASON = "ComputeProbeFaulty"

DEFAULT_TAINTS = (
    FAULTY_TAINT,
    "nvidia.com/gpu-error",  # NVSentinel's fault quarantine (also -nvlink-error, syslog-xid-error)
    "nvidia.com/gpu-nvlink-error",
    "nvidia.com/syslog-xid-error",
)
"""Taint keys (any value, any effect) that mark a node's GPUs unhealthy."""
DEFAULT_CONDITIONS = (
    ("AcceleratedHardwareReady", "False"),  # the EKS node monitoring agent
    ("GpuPcieWatch", "True"),  # NVSentinel's health monitors (a GPU fell off the bus)
)
"""Node conditions (type, the status that means unhealthy). Not ours (:data:`FAULTY_CONDITION`): the taint
is what keeps jobs off, so that removing it is all a person does to let them back (the operator then sets
the condition False: :func:`stale_condition`)."""

_LABEL_VALUE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Rules:
    """What marks a node's GPUs unhealthy."""

    taints: tuple[str, ...] = DEFAULT_TAINTS
    conditions: tuple[tuple[str, str], ...] = DEFAULT_CONDITIONS


def parse_rules(taints: str | None, conditions: str | None) -> Rules:
    """The operator's ``--unhealthy-taints KEY,KEY`` and ``--unhealthy-conditions TYPE=STATUS,...``
    (None: the defaults); raises ValueError naming the flag, the value and what is accepted."""
    keys = DEFAULT_TAINTS if taints is None else tuple(k.strip() for k in taints.split(",") if k.strip())
    pairs: list[tuple[str, str]] = []
    for item in conditions.split(",") if conditions is not None else []:
        kind, sep, status = item.strip().partition("=")
        if not item.strip():
            continue
        if not sep or not kind or status not in ("True", "False", "Unknown"):
            raise ValueError(
                f"--unhealthy-conditions: {item.strip()!r} is not TYPE=STATUS with STATUS True, False or "
                "Unknown (e.g. AcceleratedHardwareReady=False)"
            )
        pairs.append((kind, status))
    return Rules(keys, DEFAULT_CONDITIONS if conditions is None else tuple(pairs))


def why_unhealthy(node: Mapping[str, Any], rules: Rules) -> str | None:
    """What on ``node`` marks its GPUs unhealthy (the first taint or condition found), or None."""
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("key") in rules.taints:
            value = f"={taint['value']}" if taint.get("value") else ""
            return f"taint {taint['key']}{value}:{taint.get('effect', '')}"
    bad = dict(rules.conditions)
    for condition in (node.get("status") or {}).get("conditions") or []:
        kind = condition.get("type")
        if kind in bad and condition.get("status") == bad[kind]:
            return f"condition {kind}={condition['status']}"
    return None


def taint_value(device: str) -> str:
    """``device`` as a taint's value (a label value: at most 63 of ``[A-Za-z0-9._-]``, alphanumeric at both
    ends): ``GPU-8f3c…`` as it is, ``cuda:3`` as ``cuda-3``."""
    value = _LABEL_VALUE.sub("-", device)[:63].strip("-._")
    return value or "unknown"


def faulty_taint(device: str) -> dict[str, str]:
    return {"key": FAULTY_TAINT, "value": taint_value(device), "effect": "NoSchedule"}


def with_faulty_taint(taints: Iterable[Mapping[str, Any]], device: str) -> list[dict[str, Any]] | None:
    """``taints`` with ours added, or None when the node has it already (a first faulty device stays
    named: taints are unique by key and effect)."""
    kept = [dict(t) for t in taints]
    if any(t.get("key") == FAULTY_TAINT and t.get("effect") == "NoSchedule" for t in kept):
        return None
    return [*kept, faulty_taint(device)]


def faulty_condition(message: str, now: str) -> dict[str, str]:
    """The Node condition a faulty verdict sets (``now``: RFC 3339)."""
    return {
        "type": FAULTY_CONDITION,
        "status": "True",
        "reason": FAULTY_REASON,
        "message": message[:1000],
        "lastTransitionTime": now,
        "lastHeartbeatTime": now,
    }


def stale_condition(node: Mapping[str, Any]) -> bool:
    """Our condition says True but our taint is gone: a person let the node back (its condition follows)."""
    taints = (node.get("spec") or {}).get("taints") or []
    conditions = (node.get("status") or {}).get("conditions") or []
    marked = any(c.get("type") == FAULTY_CONDITION and c.get("status") == "True" for c in conditions)
    return marked and not any(t.get("key") == FAULTY_TAINT for t in taints)


def cleared_condition(now: str) -> dict[str, str]:
    return {
        "type": FAULTY_CONDITION,
        "status": "False",
        "reason": "TaintRemoved",
        "message": f"the {FAULTY_TAINT} taint was removed: DDPJobs may land here again",
        "lastTransitionTime": now,
        "lastHeartbeatTime": now,
    }
