"""A pod whose volumes the kubelet cannot mount: its ``FailedMount`` events → a start-up failure. Pure.

A Secret or ConfigMap missing for a *volume* (``spec.checkpoint.s3.credentialsSecret``,
``spec.podTemplate.volumes``), or a volume that cannot mount, is no container's waiting reason: the kubelet
mounts the volumes before it makes the pod's sandbox, so the pod stays ``ContainerCreating`` with its
``PodReadyToStartContainers`` condition False, and only the kubelet's ``FailedMount`` events on the pod
say why (``MountVolume.SetUp failed for volume "checkpoint" : secret "s3-creds" not found``).
:func:`pods_to_read` says which pods' events are worth a read (:mod:`ddp_operator.runtime.reconcile` lists
them: the ``list`` on events the chart grants for the claim's diagnosis); :func:`failure` reads them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from ddp_operator.api import reasons
from ddp_operator.observe.references import Reference
from ddp_operator.observe.startup import MESSAGE_CHARS, StartupFailure, missing, node_rank

SCHEDULED_SECONDS = 10.0
"""A pod scheduled this long ago whose sandbox is still not made is worth asking about: a mount that
succeeds takes less (an image pull comes after the sandbox, so a slow pull is not read)."""
FAILED_MOUNT = "FailedMount"
"""The kubelet's event reason."""


def _condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    found = [c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == kind]
    return found[0] if found else {}


def pods_to_read(pods: Sequence[Mapping[str, Any]], now: dt.datetime) -> tuple[str, ...]:
    """The pods scheduled at least :data:`SCHEDULED_SECONDS` ago whose sandbox the kubelet has not made
    (``PodReadyToStartContainers`` False: Kubernetes 1.29 on; without it, none): their volumes wait."""
    found = []
    for pod in pods:
        scheduled = _condition(pod, "PodScheduled")
        if (pod.get("metadata") or {}).get("deletionTimestamp") or scheduled.get("status") != "True":
            continue
        if _condition(pod, "PodReadyToStartContainers").get("status") != "False":
            continue
        try:
            since = dt.datetime.fromisoformat(str(scheduled.get("lastTransitionTime")).replace("Z", "+00:00"))
        except ValueError:
            continue
        if (now - since).total_seconds() >= SCHEDULED_SECONDS:
            found.append(str(pod["metadata"].get("name")))
    return tuple(found)


def failure(
    events: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]], refs: Sequence[Reference] = ()
) -> StartupFailure | None:
    """Why the first of ``pods`` (by completion index) that has ``FailedMount`` events
    cannot mount its volumes: a missing Secret or ConfigMap is final (the fix names the spec's field), any
    other message is quoted (the kubelet retries). The kubelet's later summary (``Unable to attach or mount
    volumes ... timed out``) gives way to the event that says why."""
    if not events:
        return None
    mine = {
        str(meta.get("name")): pod
        for pod in pods
        if not (meta := pod.get("metadata") or {}).get("deletionTimestamp")
    }
    about: dict[str, list[Mapping[str, Any]]] = {}
    for event in events:
        target = event.get("involvedObject") or {}
        if event.get("reason") == FAILED_MOUNT and target.get("kind") == "Pod" and target.get("name") in mine:
            about.setdefault(str(target["name"]), []).append(event)
    for name in sorted(about, key=lambda name: (node_rank(mine[name]), name)):
        namespace = mine[name]["metadata"].get("namespace") or "default"
        newest = sorted(about[name], key=_stamp, reverse=True)
        said = [str(e.get("message") or "").strip()[:MESSAGE_CHARS] for e in newest]
        for message in said:
            if found := missing(message, refs, namespace):
                return StartupFailure(
                    name, "", False, FAILED_MOUNT, message, reasons.MOUNT_FAILED, True, *found
                )
        message = next((m for m in said if m.startswith("MountVolume")), said[0])
        fix = (
            f"the kubelet retries; if it persists, see `kubectl describe pod {name} -n {namespace}` (the "
            "volume's source, its driver or server)"
        )
        return StartupFailure(
            name, "", False, FAILED_MOUNT, message, reasons.MOUNT_FAILED, False, fix, message
        )
    return None


def _stamp(event: Mapping[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or "")
