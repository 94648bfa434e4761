"""Kueue, one room of the decision: what a queued DDPJob says while Kueue holds its Job. Pure.

With ``spec.queueName`` the attempt's Job is created suspended and Kueue admits it by unsuspending it
(:mod:`ddp_operator.observe.workloads` reads its Workload). An eviction (preemption by a higher-priority
Workload, pods not all ready in time under ``waitForPodsReady``, a stopped queue) suspends the Job again
(its pods get SIGTERM, and the trainer checkpoints) and requeues it. None of that is a failure of the
DDPJob: no attempt ends, no restart is counted, and when Kueue admits the Workload again the same Job's
pods start from the latest checkpoint. Here:

- :func:`said`: the room's one entrance, for a running attempt's Job: the below at once (:class:`Queued`);
- :func:`workload`: the current Job's Workload, when the spec names a queue and Kueue made one;
- :func:`workload_status`: ``status.kueue`` (:func:`summary`: the Workload, where it is admitted, how often
  Kueue evicted it), or none for a new attempt's Job (the earlier Job's Workload is gone with it);
- :func:`queued`: the phase reason and message of a DDPJob whose Job Kueue keeps suspended
  (:func:`waiting`: naming Kueue, the LocalQueue and Kueue's own words), Warning for an eviction or an
  inadmissible Workload;
- :func:`slice_waiting`: why a running elastic job's new pods wait for their Workload slice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ddp_operator.api import reasons, typed_status
from ddp_operator.api.spec import Spec
from ddp_operator.decide.status_builder import Parts, Said
from ddp_operator.observe import workloads
from ddp_operator.observe.facts import JobFacts
from ddp_operator.observe.workloads import Workload

# The DDPJob's phase reasons while its Job is suspended for Kueue (its Ready condition's too).
PENDING: Final = reasons.KUEUE_PENDING
INADMISSIBLE: Final = reasons.KUEUE_INADMISSIBLE
PREEMPTED: Final = reasons.KUEUE_PREEMPTED
REQUEUED: Final = reasons.KUEUE_REQUEUED
EVICTED: Final = reasons.KUEUE_EVICTED
ADMITTED: Final = reasons.KUEUE_ADMITTED
WARNINGS: Final = frozenset({INADMISSIBLE, PREEMPTED, REQUEUED, EVICTED})
"""The reasons a Warning event announces."""
_EVICTIONS: Final = {
    "Preempted": (PREEMPTED, "preempted by Kueue"),
    "PodsReadyTimeout": (REQUEUED, "requeued by Kueue"),
}
"""Kueue's eviction reasons this operator names, and how its message begins; any other is ``EVICTED``."""


@dataclass(frozen=True)
class Queued:
    """What Kueue's room says of a running attempt's Job (:func:`said`)."""

    status: Said
    """``status.kueue`` (:func:`workload_status`)."""
    waiting: Said | None
    """The phase and ``Ready`` while Kueue keeps the Job suspended (:func:`queued`); None otherwise."""
    gate: str
    """Why an elastic job's new pods wait for their Workload slice (:func:`slice_waiting`); '' otherwise."""


def said(spec: Spec, job: JobFacts, observed: Mapping[str, Mapping[str, Any]] | None) -> Queued:
    """The room entered once for a running attempt's Job ``job``, when the spec names a queue: its Workload
    read from ``observed`` (:func:`workload`), and what the status says of it (:class:`Queued`)."""
    found, queue = workload(spec, job, observed), spec.queue_name or ""
    waiting = queued(queue, job.name, found) if job.suspended else None
    return Queued(
        workload_status(found), waiting, slice_waiting(queue, found) if spec.elastic is not None else ""
    )


def workload(
    spec: Spec, job: JobFacts | None, observed: Mapping[str, Mapping[str, Any]] | None
) -> Workload | None:
    """Kueue's Workload of the current Job, read, when the spec names a queue and Kueue made one."""
    found = (observed or {}).get(job.name) if job and spec.queue_name else None
    return workloads.read(found) if found is not None else None


def workload_status(found: Workload | None) -> Said:
    """``status.kueue`` of the current Job's Workload; none for a new attempt's Job, whose Workload Kueue
    has not made yet (the earlier Job's is gone with it)."""
    if queued := summary(found):
        return Said(dict(kueue=queued))
    return Said(drop=("kueue",))


def queued(queue: str, job: str, found: Workload | None) -> Said:
    """Pending while Kueue keeps Job ``job`` suspended, with Kueue's words, as the phase and ``Ready``."""
    reason, message = waiting(queue, job, found)
    return Said(
        conditions=((reasons.READY, False, reason, message),),
        phase=(reasons.PENDING, reason, message, reason in WARNINGS),
    )


def waiting(queue: str, job: str, workload: Workload | None) -> tuple[str, str]:
    """The phase reason and message of a DDPJob whose Job Kueue keeps suspended."""
    if workload is None:
        return PENDING, (
            f"Job {job} waits for Kueue to admit it to LocalQueue {queue}; Kueue has made no Workload for it "
            f"yet (is Kueue installed, managing batch/job?)"
        )
    again = f"; waiting in LocalQueue {queue} to be admitted again"
    why = f": {workload.pending}" if workload.pending else ""
    if workload.evicted is not None:
        reason, message = workload.evicted
        ours, said = _EVICTIONS.get(reason, (EVICTED, f"evicted by Kueue ({reason})"))
        return ours, f"{said}: {message}{again}{why}"
    if workload.admitted:  # for the moment until Kueue unsuspends the Job
        where = f" to ClusterQueue {workload.cluster_queue}" if workload.cluster_queue else ""
        return ADMITTED, f"Kueue admitted Workload {workload.name}{where}; Job {job} is about to start"
    if workload.inadmissible:
        return INADMISSIBLE, f"Kueue cannot admit Workload {workload.name} from LocalQueue {queue}{why}"
    why = why or ": no quota reserved yet"
    return PENDING, f"waiting for Kueue to admit Workload {workload.name} from LocalQueue {queue}{why}"


def slice_waiting(queue: str, workload: Workload | None) -> str:
    """Why a running elastic job's new pods wait, in Kueue's words, when its current slice has no quota
    reserved yet; '' otherwise."""
    if workload is None or workload.admitted or workload.cluster_queue:
        return ""
    why = f": {workload.pending}" if workload.pending else ": no quota reserved yet"
    return (
        f"; the new pods wait behind Kueue's scheduling gate for Workload slice {workload.name} to be "
        f"admitted from LocalQueue {queue}{why}"
    )


def summary(found: Workload | None) -> Parts | None:
    """``status.kueue``: the Workload, where it is admitted, how often Kueue evicted it, said as its parts
    for the builder to write."""
    if found is None:
        return None
    parts: list[dict[str, Any]] = [
        dict(workload=found.name, admitted=found.admitted, evictions=found.evictions)
    ]
    if found.cluster_queue:
        parts.append(dict(cluster_queue=found.cluster_queue))
    return Parts(typed_status.Kueue, tuple(parts))
