"""Kopf peering before the operator starts: is the peering object there?

Kopf with a peering name pauses until it can peer, and without the object it waits silently. The chart
creates ``ClusterKopfPeering ddpjob-operator`` (or a ``KopfPeering`` in each watched namespace); a by-hand
``ddpjob operator`` next to ``manifests/crd.yaml`` alone has only the CRDs. So the operator looks first:
with the object it peers, without it it runs standalone and says so.
"""

from __future__ import annotations

import random
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
    try:
        kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()  # type: ignore[no-untyped-call]
    api = kubernetes.client.CustomObjectsApi()
    absent = []
    wanted: list[str | None] = list(namespaces) or [None]
    only = f"metadata.name={NAME}"  # list, not get: the chart grants Kopf's verbs (list, watch, patch) only
    for namespace in wanted:
        found: Any
        try:
            if namespace is None:
                found = api.list_cluster_custom_object(
                    GROUP, VERSION, "clusterkopfpeerings", field_selector=only
                )
            else:
                found = api.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, "kopfpeerings", field_selector=only
                )
        except ApiException as exc:
            if exc.status != 404:  # 404: no such kind (its CRD is missing)
                raise
            found = {}
        if not found.get("items"):
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
