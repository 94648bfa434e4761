"""Whether an elastic job's rendezvous store serves, from its pods: the ``RendezvousStoreReady`` condition.
Pure.

The store is a Job of its own (:mod:`ddp_operator.children.store`), left out of the workers' indexes; the
runtime keeps its pods in an index of their own and hands the current attempt's here. While the store does
not serve, no node can join or leave the world (the running ones train on), and a new attempt's workers wait
for it: so the condition says which of the kubelet's, the scheduler's or the Job controller's states keeps it
from serving, in their words, and :mod:`ddp_operator.decide.decision` posts a Warning event when it stops
serving and a Normal one when it serves again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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

    @property
    def fault(self) -> bool:
        """Something the user may need to act on (not a store that is merely starting)."""
        return self.reason in (UNSCHEDULABLE, CANNOT_START, LOST)


def read(pods: Sequence[Mapping[str, Any]], attempt: int, job_name: str) -> StoreReading:
    """The store of ``attempt`` (its Job ``job_name``), from its pods as the API server returns them: the
    newest one that is not being deleted speaks (the Job controller's replacement of a lost one); a store
    whose every pod is gone or going is lost until the Job controller makes another."""
    mine = [pod for pod in pods if attempt_of(pod) == attempt]
    live = [pod for pod in mine if not (pod.get("metadata") or {}).get("deletionTimestamp")]
    running = [pod for pod in live if (pod.get("status") or {}).get("phase") not in ("Failed", "Succeeded")]
    if not running:
        if not mine:
            return StoreReading(
                False, STARTING, f"the rendezvous store's Job {job_name} has no pod yet; {WAITS}"
            )
        last = _newest(mine)
        gone = (last.get("status") or {}).get("phase") in ("Failed", "Succeeded")
        state = str((last.get("status") or {}).get("phase")).lower() if gone else "being deleted"
        said = (last.get("status") or {}).get("message") or (last.get("status") or {}).get("reason") or ""
        why = f" ({said})" if said else ""
        return StoreReading(
            False,
            LOST,
            f"the rendezvous store's pod {_name(last)} is {state}{why}; its Job {job_name} starts another, "
            f"which starts empty and is given the round back by the running nodes; {WAITS}",
        )
    pod = _newest(running)
    name = _name(pod)
    if ready(pod):
        return StoreReading(True, SERVING, f"pod {name} serves the rendezvous")
    if (failed := startup.first_failure([pod])) is not None:
        return StoreReading(False, CANNOT_START, f"the rendezvous store cannot start: {failed.said}; {WAITS}")
    if (placed := unschedulable([pod])) is not None:
        return StoreReading(
            False, UNSCHEDULABLE, f"the rendezvous store's pod {name} cannot be scheduled: {placed}; {WAITS}"
        )
    return StoreReading(False, STARTING, f"the rendezvous store's pod {name} is starting; {WAITS}")


def _newest(pods: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    return max(
        pods, key=lambda pod: (str((pod.get("metadata") or {}).get("creationTimestamp") or ""), _name(pod))
    )


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name") or "?")
