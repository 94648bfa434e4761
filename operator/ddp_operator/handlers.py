"""Kopf handlers: wire events to functions. No logic of their own.

Every DDPJob is reconciled from three in-memory indexes (its own body, its batch Jobs, its pods), whenever
any of them changes and on a timer, so status always comes from what exists: :mod:`observe` reads the
children into facts, :mod:`reconcile` decides (pure), :mod:`apply` carries the plan out (idempotent).
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any

import kopf
import kubernetes

from . import apply, crd, names
from .recent import Recent
from .scraper import Scraper
from .status import finished

LABELS = {names.MANAGED_BY_LABEL: names.MANAGED_BY}
Key = tuple[str, str]
# One reconcile at a time per DDPJob: child events, the timer and the DDPJob's own events run in threads.
_LOCKS: collections.defaultdict[Key, threading.Lock] = collections.defaultdict(threading.Lock)
# The latest reading of each running DDPJob's /metrics, refreshed in background threads, never in a reconcile.
SCRAPER = Scraper()
# What this operator wrote that the indexes above do not show yet (read your own writes).
RECENT = Recent()


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Kopf's own bookkeeping lives in annotations under our prefix, so the CRD's status schema stays ours.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=crd.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=crd.GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{crd.GROUP}/kopf-finalizer"
    # One active operator: replicas peer through KopfPeering under this name; the highest priority acts.
    settings.peering.name = "ddpjob-operator"
    # Watches end server-side after 5 minutes, so a silently dropped connection is noticed within that time.
    settings.watching.server_timeout = 300
    # The client gives the server a little longer than its own timeout before it calls the stream dead.
    settings.watching.client_timeout = 330
    # Connecting should be quick on a healthy API server; retry rather than hang.
    settings.watching.connect_timeout = 10
    # Transitions are posted as events by reconcile itself; Kopf only posts its warnings and errors.
    settings.posting.level = logging.WARNING
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()


@kopf.index(crd.GROUP, crd.VERSION, crd.PLURAL)
def ddpjob_bodies(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Key, dict[str, Any]]:
    return {(namespace or "", name): dict(body)}


@kopf.index("batch", "v1", "jobs", labels=LABELS)
def ddpjob_jobs(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Key, dict[str, Any]]:
    return {_owner(namespace, labels): dict(body)}


@kopf.index("v1", "pods", labels=LABELS)
def ddpjob_pods(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Key, dict[str, Any]]:
    return {_owner(namespace, labels): dict(body)}


def _owner(namespace: str | None, labels: kopf.Labels) -> Key:
    """The DDPJob a child belongs to, by its label."""
    return (namespace or "", labels.get(names.JOB_NAME_LABEL, ""))


@kopf.on.event(crd.GROUP, crd.VERSION, crd.PLURAL)
def on_ddpjob(namespace: str | None, name: str, type: str, **kwargs: Any) -> None:
    if type != "DELETED":
        reconcile((namespace or "", name), **kwargs)
    else:
        SCRAPER.forget((namespace or "", name))
        RECENT.forget((namespace or "", name))


@kopf.on.event("batch", "v1", "jobs", labels=LABELS)
def on_job(namespace: str | None, labels: kopf.Labels, **kwargs: Any) -> None:
    reconcile(_owner(namespace, labels), **kwargs)


@kopf.on.event("v1", "pods", labels=LABELS)
def on_pod(namespace: str | None, labels: kopf.Labels, **kwargs: Any) -> None:
    reconcile(_owner(namespace, labels), **kwargs)


def _watched(spec: kopf.Spec, status: kopf.Status, **_: Any) -> bool:
    """Finished DDPJobs need no timer, unless their ttlSecondsAfterFinished is still running."""
    return not finished(status) or spec.get("ttlSecondsAfterFinished") is not None


@kopf.timer(crd.GROUP, crd.VERSION, crd.PLURAL, interval=5, idle=0, when=_watched)
def on_timer(namespace: str | None, name: str, **kwargs: Any) -> None:
    """The safety net: deadlines, TTLs and restarts waiting for old pods are noticed within seconds."""
    reconcile((namespace or "", name), **kwargs)


def reconcile(
    key: Key,
    *,
    ddpjob_bodies: kopf.Index[Key, dict[str, Any]],
    ddpjob_jobs: kopf.Index[Key, dict[str, Any]],
    ddpjob_pods: kopf.Index[Key, dict[str, Any]],
    logger: apply.Logger,
    **_: Any,
) -> None:
    """One reconcile at a time per DDPJob, from what the indexes hold now."""
    with _LOCKS[key]:
        for body in list(ddpjob_bodies.get(key, []))[:1]:
            jobs, pods = list(ddpjob_jobs.get(key, [])), list(ddpjob_pods.get(key, []))
            apply.reconcile(body, jobs, pods, logger, ddpjob_bodies, SCRAPER, RECENT)
