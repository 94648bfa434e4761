"""What a reconcile reads beyond Kopf's watches, and only while a DDPJob waits: the checkpoint claim and
the events about it, the kubelet's ``FailedMount`` and the Job controller's ``FailedCreate`` events, and
whether the Secrets and ConfigMaps its spec names exist (their metadata only). The I/O edge beside
:mod:`~ddp_operator.runtime.reconcile`; what the answers mean is decided in :mod:`ddp_operator.observe`.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from ddp_operator.api.spec import Spec, SpecError
from ddp_operator.observe import claims, mounts, references, refused_pods


def read_all(
    body: Mapping[str, Any],
    jobs: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    now: dt.datetime,
    spec: Spec | SpecError,
) -> tuple[claims.ClaimReading | None, tuple[dict[str, Any], ...], frozenset[tuple[str, str]]]:
    """What a reconcile reads beyond the indexes, in one call and in this order: the checkpoint claim
    (:func:`read_claim`), the events about the pods and Jobs that wait (:func:`read_events`) and the
    Secrets and ConfigMaps ``spec`` (as the reconcile parsed it) needs that are missing
    (:func:`read_missing`)."""
    return read_claim(body, pods), read_events(body, jobs, pods, now), read_missing(body, spec)


def read_claim(body: Mapping[str, Any], pods: list[dict[str, Any]]) -> claims.ClaimReading | None:
    """The checkpoint claim and the events about it (or, once it is bound, the ``FailedAttachVolume``
    events of the DDPJob's pods), when :func:`claims.claim_to_read` says the decision needs them: two
    GETs while a job's pods wait, none once they run."""
    name = claims.claim_to_read(body, pods)
    if name is None:
        return None
    namespace = body["metadata"]["namespace"]
    core = kubernetes.client.CoreV1Api(api_client())
    try:
        return _read_claim(core, namespace, name, pods)
    except ApiException as exc:
        if exc.status != 403:
            raise
        # an older chart's ClusterRole: no diagnosis, but the reconcile goes on
        logging.getLogger(__name__).warning(f"cannot read claim {name} ({exc.status} {exc.reason})")
        return None


def read_events(
    body: Mapping[str, Any], jobs: list[dict[str, Any]], pods: list[dict[str, Any]], now: dt.datetime
) -> tuple[dict[str, Any], ...]:
    """The events the decision needs beside the indexes: the kubelet's ``FailedMount`` on the pods whose
    volumes wait (:func:`mounts.pods_to_read`) and the Job controller's ``FailedCreate`` on a Job without
    pods (:func:`refused_pods.jobs_to_read`: Pod Security may have refused them). One LIST for each that
    waits, none once the pods run."""
    if (body.get("status") or {}).get("phase") in ("Succeeded", "Failed", "Suspended"):
        return ()
    wanted = (
        ("Pod", mounts.FAILED_MOUNT, set(mounts.pods_to_read(pods, now))),
        ("Job", refused_pods.FAILED_CREATE, set(refused_pods.jobs_to_read(jobs, pods, now))),
    )
    core, namespace = kubernetes.client.CoreV1Api(api_client()), body["metadata"]["namespace"]
    found: list[dict[str, Any]] = []
    for kind, reason, waiting in wanted:
        if not waiting:
            continue
        selector = f"involvedObject.kind={kind},reason={reason}"
        try:
            items = (ignore((), core.list_namespaced_event, namespace, field_selector=selector) or {}).get(
                "items", []
            )
        except ApiException as exc:
            if exc.status != 403:
                raise
            logging.getLogger(__name__).warning(
                f"cannot read the {kind}s' events ({exc.status} {exc.reason})"
            )
            continue
        found += [e for e in items if (e.get("involvedObject") or {}).get("name") in waiting]
    return tuple(found)


METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
"""The API server answers a GET with the object's metadata alone: the operator never receives a Secret's
data (the chart's ``checkReferences.namespaces`` grants ``get`` on Secrets and ConfigMaps there for this,
nothing more)."""
LOOK_UP_NAMESPACES: frozenset[str] = frozenset()
"""Where the operator looks up the Secrets and ConfigMaps a spec names (``--check-references``, which the
chart passes for each of ``checkReferences.namespaces``, where it grants the ``get``). Elsewhere, and
everywhere by default, it never asks: a missing one is named from the pod's kubelet."""
_FORBIDDEN: set[tuple[str, str]] = (
    set()
)  # (namespace, kind) refused all the same: said once, never asked again


def read_missing(body: Mapping[str, Any], spec: Spec | SpecError) -> frozenset[tuple[str, str]]:
    """The Secrets and ConfigMaps the spec (``body``'s, as the reconcile parsed it) needs that are not in its
    namespace, while its pods have not all started (:func:`references.to_look_up`), in the namespaces of
    :data:`LOOK_UP_NAMESPACES` only: one metadata-only GET each, none once the pods run. A kind the operator
    may not read there all the same (a Role missing) is said once in its log and left to the kubelet to
    report."""
    namespace = str(body["metadata"].get("namespace") or "")
    if namespace not in LOOK_UP_NAMESPACES:  # no access asked for
        return frozenset()
    phase = str((body.get("status") or {}).get("phase") or "")
    if phase not in references.LOOK_UP_PHASES:  # the pods run (or ran)
        return frozenset()
    if isinstance(spec, SpecError):
        return frozenset()
    wanted = references.to_look_up(spec, phase)
    core, found = kubernetes.client.CoreV1Api(api_client()), set()
    for kind, name in wanted:
        if (namespace, kind) in _FORBIDDEN:
            continue
        read = core.read_namespaced_secret if kind == "Secret" else core.read_namespaced_config_map
        try:
            if ignore((404,), read, name, namespace, _headers={"Accept": METADATA_ONLY}) is None:
                found.add((kind, name))
        except ApiException as exc:
            if exc.status != 403:
                raise
            _FORBIDDEN.add((namespace, kind))
            logging.getLogger(__name__).warning(
                references.refused(kind, namespace, f"{exc.status} {exc.reason}")
            )
    return frozenset(found)


def _read_claim(
    core: kubernetes.client.CoreV1Api, namespace: str, name: str, pods: list[dict[str, Any]]
) -> claims.ClaimReading:
    claim = ignore((404,), core.read_namespaced_persistent_volume_claim, name, namespace)
    if claim is not None and (claim.get("status") or {}).get("phase") == "Bound":
        mine = {pod["metadata"]["name"] for pod in pods}
        found = ignore((), core.list_namespaced_event, namespace, field_selector="reason=FailedAttachVolume")
        events = [e for e in (found or {}).get("items", []) if e["involvedObject"].get("name") in mine]
    else:
        selector = f"involvedObject.kind=PersistentVolumeClaim,involvedObject.name={name}"
        events = (ignore((), core.list_namespaced_event, namespace, field_selector=selector) or {}).get(
            "items", []
        )
    return claims.ClaimReading(name, claim, tuple(events))


def ignore(codes: tuple[int, ...], call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The call's answer (its JSON body, parsed), or None where it failed with one of ``codes``."""
    try:
        response = call(*args, **kwargs, _preload_content=False)
    except ApiException as exc:
        if exc.status not in codes:
            raise
        return None
    return json.loads(response.data) if response.data else None


CONNECTIONS = 32
"""The API client's pool: more connections than reconciles can run at once (Kopf's handler threads and the
timer's). With fewer, a reconcile finds the pool empty, opens a connection of its own (a TLS handshake, on
the API server's CPU too) and the pool, full again, closes it."""


@functools.cache
def api_client() -> kubernetes.client.ApiClient:
    """One API client, so one connection pool, for every reconcile (made after Kopf's startup loaded the
    configuration). An API class made without one makes its own: three TLS contexts and connections per
    reconcile, which cost the operator tens of MiB with a hundred DDPJobs."""
    configuration = kubernetes.client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = CONNECTIONS
    return kubernetes.client.ApiClient(configuration)
