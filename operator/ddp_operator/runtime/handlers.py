"""Kopf handlers: wire events to functions. No logic of their own.

Every DDPJob is reconciled from three in-memory indexes (its own body, its batch Jobs, its pods), whenever
any of them changes and on a timer (:mod:`ticker`, the operator's own: Kopf's timer would put a finalizer on
every DDPJob), so status always comes from what exists: :mod:`reconcile` reads what the indexes lack,
:mod:`ddp_operator.decide.decision` observes the children into facts and decides (pure), and
:mod:`reconcile` carries the plan out (idempotent).
"""

from __future__ import annotations

import collections
import contextvars
import logging
import threading
import time
from typing import Any

import kopf
import kubernetes

from ddp_operator.api import crd, names
from ddp_operator.decide.status import finished
from ddp_operator.observe import nodehealth, workloads
from ddp_operator.runtime import heap, nodes, opmetrics, reconcile
from ddp_operator.runtime.lease import Elector
from ddp_operator.runtime.recent import Recent
from ddp_operator.runtime.scraper import Scraper
from ddp_operator.runtime.slim import slim, slim_job, slim_pod
from ddp_operator.runtime.ticker import Ticker

ATTEMPTS: dict[str, Any] = {names.MANAGED_BY_LABEL: names.MANAGED_BY, names.STORE_LABEL: kopf.ABSENT}
STORES: dict[str, Any] = {names.MANAGED_BY_LABEL: names.MANAGED_BY, names.STORE_LABEL: "true"}
"""An elastic job's rendezvous store pods: an index of their own, not the workers'."""
"""The Jobs and pods the operator follows: the attempts' and their workers, not an elastic job's rendezvous
store (children/store_job.py), which it creates and deletes with them and whose state no decision reads."""
Key = tuple[str, str]
# One reconcile at a time per DDPJob: child events, the timer and the DDPJob's own events run in threads.
_LOCKS: collections.defaultdict[Key, threading.Lock] = collections.defaultdict(threading.Lock)
# The latest reading of each running DDPJob's /metrics, refreshed in background threads, never in a reconcile.
SCRAPER = Scraper()
# What this operator wrote that the indexes above do not show yet (read your own writes).
RECENT = Recent()
# The CLI's Lease holder (``ddpjob operator --lease``): no reconcile writes unless it may act (past its renew
# deadline the process ends, checked here too: a reconcile that wakes from a stall may run before the
# watchdog thread), nor once it releases the Lease (:func:`settle`).
LEASE: Elector | None = None
SETTLED = threading.Event()
"""Set by :func:`settle`: Kopf has stopped, no reconcile writes any more."""
TIMER_INTERVAL_SECONDS = 5.0
HANDLER_THREADS = 16
# What the timer needs from Kopf, taken from the first DDPJob event: the indexes, settings and context.
_KOPF: dict[str, Any] = {}


# When an event last reconciled each DDPJob (time.monotonic()): the timer leaves alone a DDPJob that an
# event reconciled less than its interval ago, so a burst of creations is not slowed by reconciles that
# decide nothing new. The timer's own reconciles are not recorded: every round reaches the others.
_LAST: dict[Key, float] = {}


def _tick(key: Key) -> None:
    """The timer's reconcile of one DDPJob (the safety net: deadlines, TTLs and restarts waiting for old
    pods are noticed within seconds)."""
    if time.monotonic() - _LAST.get(key, 0.0) < TIMER_INTERVAL_SECONDS:
        return
    for body in list(_KOPF["ddpjob_bodies"].get(key, []))[:1]:
        if _watched(body.get("spec") or {}, body.get("status") or {}):
            logger = kopf.ObjectLogger(body=kopf.Body(body), settings=_KOPF["settings"])
            reconcile_from_indexes(
                key, logger=logger, by_timer=True, **{name: _KOPF[name] for name in INDEXES}
            )


TIMER = Ticker(
    TIMER_INTERVAL_SECONDS, lambda: _KOPF["ddpjob_bodies"].keys(), _tick, after_round=heap.Trimmer()
)
INDEXES = [
    "ddpjob_bodies",
    "ddpjob_jobs",
    "ddpjob_pods",
    "ddpjob_store_pods",
    "ddpjob_workloads",
]  # + enable_node_health's


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Kopf's own bookkeeping lives in annotations under our prefix, so the CRD's status schema stays ours.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=crd.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=crd.GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{crd.GROUP}/kopf-finalizer"
    # One acting replica is the Lease's matter (runtime/lease.py): Kopf never peers.
    settings.peering.standalone = True
    # Watches end server-side after 5 minutes, so a silently dropped connection is noticed within that time.
    settings.watching.server_timeout = 300
    # The client gives the server a little longer than its own timeout before it calls the stream dead.
    settings.watching.client_timeout = 330
    # Connecting should be quick on a healthy API server; retry rather than hang.
    settings.watching.connect_timeout = 10
    # Transitions are posted as events by reconcile itself; Kopf only posts its warnings and errors.
    settings.posting.level = logging.WARNING
    # Reconciles mostly wait on the API server: more of them at once than the default executor's
    # cpu + 4 threads keeps a burst of creations (a thousand DDPJobs applied at once) moving.
    settings.execution.max_workers = HANDLER_THREADS
    _KOPF["settings"] = settings
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()


@kopf.on.cleanup()
def stop_timer(**_: Any) -> None:
    TIMER.stop()


def settle(timeout: float = 10.0) -> bool:
    """After Kopf stopped and before the Lease is released: no reconcile starts writing any more
    (:data:`SETTLED`) and each one running has ended (its DDPJob's lock taken once), so that a
    standby that takes over never acts beside this process's last writes. False when one still ran after
    ``timeout`` (the Lease is then left to expire, not released)."""
    TIMER.stop()
    SETTLED.set()
    until = time.monotonic() + timeout
    for lock in list(_LOCKS.values()):
        if not lock.acquire(timeout=max(0.0, until - time.monotonic())):
            return False
        lock.release()
    return True


@kopf.index(crd.GROUP, crd.VERSION, crd.PLURAL)
def ddpjob_bodies(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Key, dict[str, Any]]:
    return {(namespace or "", name): slim(body)}


@kopf.index("batch", "v1", "jobs", labels=ATTEMPTS)
def ddpjob_jobs(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Key, dict[str, Any]]:
    return {_owner(namespace, labels): slim_job(body)}


@kopf.index("v1", "pods", labels=ATTEMPTS)
def ddpjob_pods(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Key, dict[str, Any]]:
    return {_owner(namespace, labels): slim_pod(body)}


@kopf.index("v1", "pods", labels=STORES)
def ddpjob_store_pods(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Key, dict[str, Any]]:
    return {_owner(namespace, labels): slim_pod(body)}


@kopf.on.event("v1", "pods", labels=STORES)
def on_store_pod(namespace: str | None, labels: kopf.Labels, **kwargs: Any) -> None:
    """A store pod changed (scheduled, serving, lost): the DDPJob's ``RendezvousStoreReady`` says so."""
    reconcile_from_indexes(_owner(namespace, labels), **kwargs)


def _owned_by_job(body: kopf.Body, **_: Any) -> bool:
    return workloads.owner_job(body) is not None


# Kueue's Workloads, by (namespace, the name of the Job that owns them): the DDPJob's status says what
# Kueue says while its Job waits (observe/workloads.py). Kueue labels a Workload with nothing of ours, so
# every Workload owned by a Job is kept, slimmed to its conditions. Without Kueue's CRD Kopf serves nothing
# here (it logs that the resource is unresolved) and picks the resource up when the CRD appears.
@kopf.index(workloads.GROUP, workloads.WORKLOADS, when=_owned_by_job)
def ddpjob_workloads(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Key, dict[str, Any]]:
    return {(namespace or "", workloads.owner_job(body) or ""): workloads.slim(body)}


@kopf.on.event(workloads.GROUP, workloads.WORKLOADS, when=_owned_by_job)
def on_workload(namespace: str | None, body: kopf.Body, **kwargs: Any) -> None:
    """A Workload changed: reconcile the DDPJob whose Job owns it (Jobs are named ``<ddpjob>-<attempt>``;
    a DDPJob of that name whose Jobs are not the owner finds no Workload of its own and decides as before)."""
    owner = ((namespace or ""), (workloads.owner_job(body) or "").rpartition("-")[0])
    if owner[1] and owner in kwargs["ddpjob_bodies"]:
        reconcile_from_indexes(owner, **kwargs)


def _owner(namespace: str | None, labels: kopf.Labels) -> Key:
    """The DDPJob a child belongs to, by its label."""
    return (namespace or "", labels.get(names.JOB_NAME_LABEL, ""))


@kopf.on.event(crd.GROUP, crd.VERSION, crd.PLURAL)
def on_ddpjob(namespace: str | None, name: str, type: str, **kwargs: Any) -> None:
    if not TIMER.started:
        _KOPF.update({name: kwargs[name] for name in INDEXES})
        opmetrics.WATCHED.watch(kwargs["ddpjob_bodies"])  # ddpjob_jobs and ddpjob_job_info, read at a scrape
        TIMER.start(contextvars.copy_context())  # Kopf's context: kopf.event works from the timer's thread
    if type != "DELETED":
        reconcile_from_indexes((namespace or "", name), **kwargs)
    else:
        SCRAPER.forget((namespace or "", name))
        RECENT.forget((namespace or "", name))
        _LAST.pop((namespace or "", name), None)


@kopf.on.event("batch", "v1", "jobs", labels=ATTEMPTS)
def on_job(namespace: str | None, labels: kopf.Labels, **kwargs: Any) -> None:
    reconcile_from_indexes(_owner(namespace, labels), **kwargs)


@kopf.on.event("v1", "pods", labels=ATTEMPTS)
def on_pod(namespace: str | None, labels: kopf.Labels, type: str, body: kopf.Body, **kwargs: Any) -> None:
    key = _owner(namespace, labels)
    if type == "DELETED":  # the index has dropped it: its last state may be rank 0's only report
        RECENT.pod_deleted(key, slim_pod(body), time.monotonic())
    reconcile_from_indexes(key, **kwargs)


def _watched(spec: Any, status: Any) -> bool:
    """Finished DDPJobs need no timer, unless their ttlSecondsAfterFinished is still running."""
    return not finished(status) or spec.get("ttlSecondsAfterFinished") is not None


def reconcile_from_indexes(
    key: Key,
    *,
    ddpjob_bodies: kopf.Index[Key, dict[str, Any]],
    ddpjob_jobs: kopf.Index[Key, dict[str, Any]],
    ddpjob_pods: kopf.Index[Key, dict[str, Any]],
    ddpjob_workloads: kopf.Index[Key, dict[str, Any]],
    logger: reconcile.Logger,
    ddpjob_store_pods: kopf.Index[Key, dict[str, Any]] | None = None,
    by_timer: bool = False,
    **kwargs: Any,
) -> None:
    """One reconcile at a time per DDPJob, from what the indexes hold now; none unless :data:`LEASE` (when
    there is one) says this process may act, asked under the DDPJob's lock (:func:`settle`)."""
    with _LOCKS[key]:
        if SETTLED.is_set() or (LEASE is not None and not LEASE.may_act()):
            return
        if not by_timer:
            _LAST[key] = time.monotonic()
        for body in list(ddpjob_bodies.get(key, []))[:1]:
            jobs, pods = list(ddpjob_jobs.get(key, [])), list(ddpjob_pods.get(key, []))
            by_job = {}
            for job in jobs:
                name = job.get("metadata", {}).get("name", "")
                if (
                    workload := workloads.current(list(ddpjob_workloads.get((key[0], name), [])))
                ) is not None:
                    by_job[name] = workload
            unhealthy = _unhealthy_nodes(kwargs.get("ddpjob_unhealthy_nodes"))
            stores = list(ddpjob_store_pods.get(key, [])) if ddpjob_store_pods is not None else []
            reconcile.reconcile(body, jobs, pods, logger, SCRAPER, RECENT, by_job, unhealthy, stores)


def _unhealthy_nodes(index: kopf.Index[str, str] | None) -> dict[str, str]:
    """The nodes whose GPUs are marked unhealthy, with why (``--node-health``; empty without it)."""
    return {name: why for name in list(index or {}) for why in list(index[name])[:1]} if index else {}


def enable_node_health(rules: nodehealth.Rules) -> None:
    """``--node-health``: follow the Nodes (an index of those whose taints or conditions mark their GPUs
    unhealthy, which new attempts avoid) and mark a faulty rank's node (:mod:`ddp_operator.runtime.nodes`).
    Registered here, before Kopf starts, so that an operator without it neither lists Nodes nor needs the
    grant."""

    def ddpjob_unhealthy_nodes(name: str, body: kopf.Body, **_: Any) -> dict[str, str]:
        why = nodehealth.why_unhealthy(body, rules)
        return {name: why} if why else {}  # {}, not None: Kopf keeps an entry whose update returns None

    def on_node(name: str, type: str, body: kopf.Body, **_: Any) -> None:
        if type != "DELETED" and nodehealth.stale_condition(body):
            nodes.clear_condition(name)

    kopf.index("v1", "nodes", id="ddpjob_unhealthy_nodes")(ddpjob_unhealthy_nodes)
    kopf.on.event("v1", "nodes", id="on_node_health")(on_node)
    INDEXES.append("ddpjob_unhealthy_nodes")
    reconcile.MARK_FAULTY_NODES = True
