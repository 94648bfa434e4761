"""Kopf peering before the operator starts: is the peering object there?

Kopf with a peering name pauses until it can peer, and without the object it waits silently. The chart
creates ``ClusterKopfPeering ddpjob-operator`` (or a ``KopfPeering`` in each watched namespace); a by-hand
``ddpjob operator`` next to ``manifests/crd.yaml`` alone has only the CRDs. So the operator looks first:
with the object it peers, without it it runs standalone and says so.

With the object, :func:`claim` announces the replica and picks its priority before Kopf starts: the first
replica to announce itself ranks highest, each later one just below those alive (a compare-and-swap on the
object's resourceVersion), so two replicas started together never both act.

While it runs, :mod:`ddp_operator.runtime.keeper` renews the record every 2 s and fences a replica that
could not (Kopf's own keep-alive renews only every 5-10 s).
"""

from __future__ import annotations

import datetime as dt
import os
import random
import socket
import time
from collections.abc import Sequence
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

NAME = "ddpjob-operator"
GROUP, VERSION = "kopf.dev", "v1"
_HORIZON_MS = 4_000_000_000_000  # 2096 in milliseconds since the epoch: every start before it is positive


def by_start_time(now: float | None = None, jitter: int | None = None) -> int:
    """A peering priority that falls with the start time (the oldest replica acts), in milliseconds, with
    three random digits below them so that two replicas started in the same millisecond still differ
    (Kopf pauses every replica of equal priority). A replica that starts later, a Deployment's new pod or a
    restarted container, stands by until the one acting is gone: never two acting at a handover."""
    started_ms = int((time.time() if now is None else now) * 1000)
    return (_HORIZON_MS - started_ms) * 1000 + (random.randint(0, 999) if jitter is None else jitter)


def missing(namespaces: Sequence[str]) -> list[str]:
    """The peering objects that are not in the cluster (``[]``: peer as usual). Clusterwide (no
    ``namespaces``) the one ``ClusterKopfPeering``, else a ``KopfPeering`` in each namespace. An answer other
    than found or not found (forbidden, unreachable) raises ``ApiException`` or ``OSError``."""
    api = _api()
    absent = []
    for namespace in _places(namespaces):
        try:
            found = _list(api, namespace)
        except ApiException as exc:
            if exc.status != 404:  # 404: no such kind (its CRD is missing)
                raise
            found = []
        if not found:
            absent.append(
                f"ClusterKopfPeering {NAME}" if namespace is None else f"KopfPeering {namespace}/{NAME}"
            )
    return absent


def standalone_warning(absent: Sequence[str]) -> str:
    """What the operator says when it falls back to standalone."""
    return (
        f"no {', '.join(absent)} in the cluster (the chart creates it; manifests/crd.yaml installs only its "
        "CRD): running standalone, without peering, so nothing pauses this operator when another one runs. "
        "To peer, create it (kind ClusterKopfPeering, or KopfPeering in each namespace, apiVersion "
        f"kopf.dev/v1, name {NAME}) and restart, or pass --standalone to say you mean it"
    )


STARTUP_GRACE_SECONDS = 60
"""How long a claimed record lives before Kopf's first keep-alive replaces it with one of the configured
lifetime: a replica that claims and then dies during its start is taken over within this much more."""


def identity(now: float | None = None) -> str:
    """This process's peering identity, in Kopf's own form (``host/start time/3 random letters``): the
    claim below and Kopf's keep-alives must write the same record."""
    started = dt.datetime.fromtimestamp(time.time() if now is None else now, dt.UTC)
    letters = "".join(random.choices("abcdefhijklmnopqrstuvwxyz0123456789", k=3))
    return f"{socket.gethostname()}/{started:%Y%m%d%H%M%S}/{letters}"


def live_priorities(records: dict[str, dict[str, Any]], own: str, now: dt.datetime) -> list[int]:
    """The priorities of the other replicas whose records in a peering object's ``status`` have not expired
    at ``now`` (Kopf's own rule: ``lastseen + lifetime`` still ahead)."""
    out = []
    for who, record in records.items():
        if who == own or not isinstance(record, dict):
            continue
        try:
            seen = dt.datetime.fromisoformat(str(record["lastseen"]))
            if seen.tzinfo is None:
                seen = seen.replace(tzinfo=dt.UTC)
            if seen + dt.timedelta(seconds=int(record.get("lifetime", 60))) > now:
                out.append(int(record.get("priority", 0)))
        except (KeyError, ValueError, TypeError):
            continue  # a record Kopf itself could not read: not a peer
    return out


def claimed_priority(others: list[int], now: float) -> int:
    """The priority a starting replica takes: with no other replica alive, :func:`by_start_time`; else one
    below the lowest alive, so that it stands by behind every replica that announced itself first."""
    return min(others) - 1 if others else by_start_time(now)


def claim(namespaces: Sequence[str], own: str, lifetime: int, tries: int = 20) -> int:
    """Announce this replica in the peering object(s) before Kopf starts and return its priority.

    Priorities by start time alone let two replicas started together both act: the older one ranks
    higher, but while it is still starting (importing, no record yet) the younger sees no peer and acts.
    Here the first to announce ranks highest: each replica reads the object, takes the priority
    :func:`claimed_priority` gives, and writes its record under the object's resourceVersion, so that
    of two replicas that read the same version one write is refused (409) and that one reads again and
    finds the other. The record lives ``lifetime`` + :data:`STARTUP_GRACE_SECONDS` seconds, until Kopf's
    keep-alive (same identity, same priority) takes it over."""
    api = _api()
    for attempt in range(tries):
        objects = [(namespace, _read(api, namespace)) for namespace in _places(namespaces)]
        now = time.time()
        at = dt.datetime.fromtimestamp(now, dt.UTC)
        others = [p for _, body in objects for p in live_priorities(body.get("status") or {}, own, at)]
        priority = claimed_priority(others, now)
        record = {
            "priority": priority,
            "lifetime": lifetime + STARTUP_GRACE_SECONDS,
            "lastseen": at.isoformat(),
        }
        try:
            for namespace, body in objects:
                _write(api, namespace, body["metadata"]["resourceVersion"], own, record)
        except ApiException as exc:
            if exc.status != 409:
                raise
            time.sleep(random.uniform(0.05, 0.3) * (attempt + 1))  # another replica wrote first: read again
            continue
        return priority
    raise RuntimeError(f"could not claim a peering priority in {NAME} after {tries} tries (409 each time)")


def _api() -> Any:
    try:
        kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
    except kubernetes.config.ConfigException:  # KUBECONFIG read now, not when the client was imported
        kubernetes.config.load_kube_config(os.environ.get("KUBECONFIG"))  # type: ignore[no-untyped-call]
    return kubernetes.client.CustomObjectsApi()


def _places(namespaces: Sequence[str]) -> list[str | None]:
    """Where the peering objects are: each namespace's ``KopfPeering``, or (``None``) the cluster's one."""
    return list(namespaces) or [None]


def _list(api: Any, namespace: str | None) -> list[dict[str, Any]]:
    """The peering object, as a list of it or of nothing: list, not get, for the chart grants Kopf's verbs
    (list, watch, patch) only."""
    only = f"metadata.name={NAME}"
    if namespace is None:
        found = api.list_cluster_custom_object(GROUP, VERSION, "clusterkopfpeerings", field_selector=only)
    else:
        found = api.list_namespaced_custom_object(
            GROUP, VERSION, namespace, "kopfpeerings", field_selector=only
        )
    return list(found.get("items") or [])


def _read(api: Any, namespace: str | None) -> dict[str, Any]:
    (body,) = _list(api, namespace)
    return dict(body)


def _write(api: Any, namespace: str | None, version: str, own: str, record: dict[str, Any]) -> None:
    """A merge patch of this replica's record, refused with 409 unless the object is still at ``version``."""
    patch = {"metadata": {"resourceVersion": version}, "status": {own: record}}
    if namespace is None:
        api.patch_cluster_custom_object(GROUP, VERSION, "clusterkopfpeerings", NAME, patch)
    else:
        api.patch_namespaced_custom_object(GROUP, VERSION, namespace, "kopfpeerings", NAME, patch)
