"""Whether an elastic job's rendezvous store serves, from its pods: the ``RendezvousStoreReady`` condition.
Pure.

The store is a Job of its own (:mod:`ddp_operator.children.store_job`), left out of the workers' indexes; the
runtime keeps its pods in an index of their own and hands the current attempt's here. While the store does
not serve, no node can join or leave the world (the running ones train on), and a new attempt's workers wait
for it: so the condition says which of the kubelet's, the scheduler's or the Job controller's states keeps it
from serving, in their words, and :mod:`ddp_operator.decide.decision` posts a Warning event when it stops
serving and a Normal one when it serves again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ddp_operator.observe import startup
from ddp_operator.observe.facts import attempt_of, ready, unschedulable

SERVING = "Serving"
STARTING = "StoreStarting"
UNSCHEDULABLE = "StoreUnschedulable"
CANNOT_START = "StoreCannotStart"
LOST = "StoreLost"
REASONS = (SERVING, STARTING, UNSCHEDULABLE, CANNOT_START, LOST)
"""The condition's reasons; every one but :data:`SERVING` says the store does not serve."""
WAITS = "no node can join or leave the world until it serves (the running ones train on)"


@dataclass(frozen=True)
class StoreReading:
    """What the store's pods say: serving or not, the condition's reason, and the sentence for people."""

    serving: bool
    reason: str
    message: str
    fault: bool = field(init=False)
    """Something the user may need to act on (not a store that is merely starting): known as it is read."""
    before: str | None = None
    """The reason the condition said before this reading (the previous status's; None: none said)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "fault", self.reason in FAULTS)


FAULTS = (UNSCHEDULABLE, CANNOT_START, LOST)


def since(reading: StoreReading, before: str | None) -> StoreReading:
    """``reading`` as the condition says it after reason ``before``: a store that is still starting after a
    fault keeps the fault's reason until it serves (the lost pod is gone from the API by then, and its
    replacement only starts), so that serving again follows a fault, and is said as such."""
    if reading.reason == STARTING and before in FAULTS:
        return StoreReading(False, str(before), reading.message, before)
    return replace(reading, before=before)


def read(
    pods: Sequence[Mapping[str, Any]], attempt: int, job_name: str, before: str | None = None
) -> StoreReading:
    """The store of ``attempt`` (its Job ``job_name``), from its pods, as the condition says it after reason
    ``before`` (:func:`since`; the previous status's, where the caller has it)."""
    return since(_read(pods, attempt, job_name), before)


def _read(pods: Sequence[Mapping[str, Any]], attempt: int, job_name: str) -> StoreReading:
    """The store of ``attempt`` (its Job ``job_name``), from its pods as the API server returns them: the
    newest one that is not being deleted speaks (the Job controller's replacement of a lost one); while it
    does not serve yet, an earlier pod of the attempt that failed or is being deleted: a lost store."""
    mine = [pod for pod in pods if attempt_of(pod) == attempt]
    gone = [pod for pod in mine if _gone(pod)]
    live = [pod for pod in mine if not _gone(pod)]
    pod = _newest(live) if live else None
    if pod is not None and ready(pod):
        return StoreReading(True, SERVING, f"pod {_name(pod)} serves the rendezvous")
    if pod is not None and (failed := startup.first_failure([pod])) is not None:
        return StoreReading(False, CANNOT_START, f"the rendezvous store cannot start: {failed.said}; {WAITS}")
    if pod is not None and (placed := unschedulable([pod])) is not None:
        return StoreReading(
            False,
            UNSCHEDULABLE,
            f"the rendezvous store's pod {_name(pod)} cannot be scheduled: {placed}; {WAITS}",
        )
    if gone:
        last = _newest(gone)
        status = last.get("status") or {}
        state = str(status.get("phase")).lower() if _finished(last) else "being deleted"
        said = f" ({why})" if (why := status.get("message") or status.get("reason")) else ""
        then = (
            f"its replacement {_name(pod)} is starting"
            if pod is not None
            else f"its Job {job_name} starts another"
        )
        return StoreReading(
            False,
            LOST,
            f"the rendezvous store's pod {_name(last)} is {state}{said}; {then}, which "
            f"starts empty and is given the round back by the running nodes; {WAITS}",
        )
    if pod is None:
        return StoreReading(False, STARTING, f"the rendezvous store's Job {job_name} has no pod yet; {WAITS}")
    return StoreReading(False, STARTING, f"the rendezvous store's pod {_name(pod)} is starting; {WAITS}")


def _gone(pod: Mapping[str, Any]) -> bool:
    """Failed, ended or being deleted: a store pod that serves no more."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp")) or _finished(pod)


def _finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded")


def _newest(pods: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    return max(
        pods, key=lambda pod: (str((pod.get("metadata") or {}).get("creationTimestamp") or ""), _name(pod))
    )


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name") or "?")
