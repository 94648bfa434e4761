"""Pods the API server refused under Pod Security admission: the Job controller's ``FailedCreate`` events
on the attempt's Job → a start-up failure naming the DDPJob's fields. Pure.

PodSecurity admission checks pods, not Jobs: in a namespace labelled
``pod-security.kubernetes.io/enforce: restricted`` the Job is created and its pods are not, and the Job
controller says why only in a ``FailedCreate`` event (``Error creating: pods "…" is forbidden: violates
PodSecurity "restricted:latest": host namespaces (hostNetwork=true), …``). :func:`jobs_to_read` says when that
is worth a read (:mod:`ddp_operator.runtime.reconcile` lists the events: the ``list`` on events the chart
already grants); :func:`failure` quotes the API server and names each field with
:func:`ddp_operator.api.pod_security_standards.violations`. The refusal is final for this spec: nothing of the
gang exists (no pod was created), and the job starts by itself if the namespace's level changes.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ddp_operator.api import names, pod_security_standards, reasons
from ddp_operator.observe.startup import APPLY_AGAIN, MESSAGE_CHARS, StartupFailure

FAILED_CREATE = "FailedCreate"
CREATED_SECONDS = 5.0
_LEVEL = re.compile(r'violates PodSecurity "([a-z]+)(?::[^"]*)?"')


def jobs_to_read(
    jobs: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]], now: dt.datetime
) -> tuple[str, ...]:
    """The unfinished, unsuspended Jobs made at least :data:`CREATED_SECONDS` ago that have no pod at all:
    their pods may have been refused (a Job's first pods come within a second or two)."""
    owned = {_attempt(pod) for pod in pods}
    found = []
    for job in jobs:
        created = _time((job.get("metadata") or {}).get("creationTimestamp"))
        if created is None or (now - created).total_seconds() < CREATED_SECONDS:
            continue
        status, spec = job.get("status") or {}, job.get("spec") or {}
        finished = any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        name = str(job["metadata"]["name"])
        if not spec.get("suspend") and not finished and _attempt(job) not in owned:
            found.append(name)
    return tuple(found)


def _time(text: Any) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(str(text).replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


def _attempt(obj: Mapping[str, Any]) -> str | None:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(names.ATTEMPT_LABEL)


def failure(
    events: Sequence[Mapping[str, Any]], job: str, namespace: str, pod: Mapping[str, Any]
) -> StartupFailure | None:
    """Why Job ``job``'s pods were refused, from its newest Pod Security ``FailedCreate`` event, or None;
    ``pod``: the pod spec the Job's template holds (the rendered one: the index keeps no template)."""
    refusals = [
        e
        for e in events
        if e.get("reason") == FAILED_CREATE
        and (e.get("involvedObject") or {}).get("kind") == "Job"
        and (e.get("involvedObject") or {}).get("name") == job
        and _LEVEL.search(str(e.get("message") or ""))
    ]
    if not refusals:
        return None
    newest = max(refusals, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    message = str(newest.get("message") or "").strip()
    match = _LEVEL.search(message)
    level = match.group(1) if match and match.group(1) in pod_security_standards.LEVELS else "restricted"
    fields = pod_security_standards.violations(pod, level)
    fix = (
        "; ".join(fields) if fields else f'the namespace {namespace} enforces Pod Security "{level}"'
    ) + f" ({pod_security_standards.ENFORCE_LABEL}={level} on namespace {namespace}): {APPLY_AGAIN}"
    return StartupFailure(
        job, "", False, FAILED_CREATE, message[:MESSAGE_CHARS], reasons.POD_SECURITY, True, fix, "PodSecurity"
    )
