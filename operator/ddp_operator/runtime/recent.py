"""Read your own writes: what this operator wrote that its watches have not shown it yet.

Kopf's indexes follow the watch streams, which trail the operator's own writes by milliseconds, or by
seconds when a hundred DDPJobs start at once. A reconcile triggered in that window (by the Job it has just
created, say) used to decide from the DDPJob as it was before its own status patch: it posted the same
transition event again and patched the status again (five times for one suspended DDPJob, each time
moving ``startTime``), and, not yet seeing the Job it had created, asked for the Service and Job again
(refused with 409, but writes all the same). :class:`Recent` keeps, per DDPJob, the object its last
status patch returned, the Jobs it created and the Jobs it patched (an elastic job's resize, a suspend), and
hands a reconcile whichever view is newer. Without the patched Jobs, a reconcile in the window after a
resize saw the Job at its old size beside a status that had already counted the scale, and counted it again.

It also keeps the last state of a deleted pod whose trainer had stopped: its termination message is rank
0's report, and a pod the Job controller deletes after a failure goes from "terminated" to gone in
milliseconds. Kopf hands a handler only the latest of an object's events that arrive within its batch
window, so the "terminated" state may never reach the index: only the DELETED event's body carries it. A
preempted attempt whose report was lost that way was taken for a crash (a gang restart counted against
``maxRestarts``, no ``Preempted`` event).

"Newer" compares ``metadata.resourceVersion`` as integers: on an API server backed by etcd (every one) it
is etcd's revision, which only grows. Where either value is not an integer the index wins, as before.
Pure: no I/O, no clock of its own (``now`` is passed in, monotonic seconds).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ddp_operator.observe import facts

Key = tuple[str, str]
JOB_MEMORY_SECONDS = 120.0
"""A created Job the index has still not shown after this long is forgotten (the index is then right)."""
POD_MEMORY_SECONDS = 120.0
"""A deleted pod's last state is kept this long: the decision on its attempt comes well within it."""


def _version(obj: Mapping[str, Any]) -> int | None:
    try:
        return int(obj.get("metadata", {}).get("resourceVersion") or "")
    except ValueError:
        return None


def newer(mine: Mapping[str, Any], indexed: Mapping[str, Any]) -> bool:
    """Whether ``mine`` is a later version of the object than ``indexed``."""
    a, b = _version(mine), _version(indexed)
    same = mine.get("metadata", {}).get("uid") == indexed.get("metadata", {}).get("uid")
    return a is not None and b is not None and same and a > b


@dataclass
class _Written:
    body: dict[str, Any] | None = None
    jobs: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    patched_jobs: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    gone_pods: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)


class Recent:
    """Per DDPJob: the body after our last status patch, the Jobs we created or patched, the last state of its
    deleted pods whose trainer had stopped (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._written: dict[Key, _Written] = {}

    def body(self, key: Key, indexed: Mapping[str, Any]) -> Mapping[str, Any]:
        """The newer of the index's DDPJob and the one our last status patch returned."""
        with self._lock:
            written = self._written.get(key)
            if written is None or written.body is None:
                return indexed
            if newer(written.body, indexed):
                return written.body
            written.body = None  # the index has caught up (or moved past us): it is the truth again
            return indexed

    def jobs(self, key: Key, indexed: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
        """The index's Jobs, each replaced by the one our last patch of it returned while that is newer, plus
        those we created that it does not show yet."""
        with self._lock:
            written = self._written.get(key)
            if written is None or not (written.jobs or written.patched_jobs):
                return indexed
            names = {job["metadata"]["name"] for job in indexed}
            for name, (when, _) in list(written.jobs.items()):
                if name in names or now - when > JOB_MEMORY_SECONDS:
                    del written.jobs[name]
            shown = [self._newer_job(written, job, now) for job in indexed]
            return [*shown, *(job for _, job in written.jobs.values())]

    @staticmethod
    def _newer_job(written: _Written, indexed: dict[str, Any], now: float) -> dict[str, Any]:
        """``indexed``, or our patch's answer for it while that is newer (then forgotten: the index caught
        up)."""
        name = indexed["metadata"]["name"]
        if (kept := written.patched_jobs.get(name)) is None:
            return indexed
        when, mine = kept
        if newer(mine, indexed) and now - when <= JOB_MEMORY_SECONDS:
            return mine
        del written.patched_jobs[name]
        return indexed

    def pods(self, key: Key, indexed: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
        """The index's pods plus the last state of deleted ones it no longer shows (for a while)."""
        with self._lock:
            written = self._written.get(key)
            if written is None or not written.gone_pods:
                return indexed
            uids = {pod.get("metadata", {}).get("uid") for pod in indexed}
            for uid, (when, _) in list(written.gone_pods.items()):
                if now - when > POD_MEMORY_SECONDS:
                    del written.gone_pods[uid]
            return [*indexed, *(pod for uid, (_, pod) in written.gone_pods.items() if uid not in uids)]

    def pod_deleted(self, key: Key, pod: Mapping[str, Any], now: float) -> None:
        """The watch said ``pod`` was deleted, in this last state: kept when its trainer had stopped."""
        uid = pod.get("metadata", {}).get("uid")
        if uid and facts.stopped(pod):
            with self._lock:
                self._written.setdefault(key, _Written()).gone_pods[str(uid)] = (now, dict(pod))

    def patched(self, key: Key, body: Mapping[str, Any]) -> None:
        """Our status patch returned ``body``."""
        with self._lock:
            self._written.setdefault(key, _Written()).body = dict(body)

    def created(self, key: Key, job: Mapping[str, Any], now: float) -> None:
        """We created ``job`` (the API server's answer)."""
        with self._lock:
            self._written.setdefault(key, _Written()).jobs[job["metadata"]["name"]] = (now, dict(job))

    def job_patched(self, key: Key, job: Mapping[str, Any], now: float) -> None:
        """Our patch of a Job (resized, suspended or resumed) returned ``job``."""
        with self._lock:
            self._written.setdefault(key, _Written()).patched_jobs[job["metadata"]["name"]] = (now, dict(job))

    def deleted(self, key: Key, job_name: str) -> None:
        """We asked for ``job_name`` to be deleted: the index alone says when it has gone."""
        with self._lock:
            if written := self._written.get(key):
                written.jobs.pop(job_name, None)
                written.patched_jobs.pop(job_name, None)

    def forget(self, key: Key) -> None:
        """The DDPJob is gone."""
        with self._lock:
            self._written.pop(key, None)


def views(
    recent: Recent | None,
    key: Key,
    body: Mapping[str, Any],
    jobs: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    now: float,
) -> tuple[Recent, Mapping[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """A reconcile's one entrance: ``recent`` (a new one where None: nothing written yet) and what it makes of
    the index's ``body``, ``jobs`` and ``pods`` (:meth:`Recent.body`, :meth:`Recent.jobs`,
    :meth:`Recent.pods`, in that order)."""
    recent = recent if recent is not None else Recent()
    return recent, recent.body(key, body), recent.jobs(key, jobs, now), recent.pods(key, pods, now)
