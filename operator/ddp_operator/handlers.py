"""Kopf handlers: observe, ask ``status.reconcile`` what to do, do it. No logic of their own.

Every DDPJob is reconciled from three in-memory indexes (its own body, its batch Jobs, its pods), whenever
any of them changes and on a timer, so status always comes from what exists. Carrying out a plan is
idempotent (create ignores AlreadyExists, delete ignores NotFound), so concurrent or repeated reconciles
and operator restarts never duplicate children.
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import kopf
import kubernetes
from kubernetes.client.exceptions import ApiException

from . import crd, opmetrics, render, status
from .spec import SpecError, parse
from .status import TERMINAL

LABELS = {"app.kubernetes.io/managed-by": render.MANAGED_BY}
Key = tuple[str, str]
# One reconcile at a time per DDPJob: child events, the timer and the DDPJob's own events run in threads.
_LOCKS: collections.defaultdict[Key, threading.Lock] = collections.defaultdict(threading.Lock)


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
    return (namespace or "", labels.get(render.JOB_NAME_LABEL, ""))


@kopf.on.event(crd.GROUP, crd.VERSION, crd.PLURAL)
def on_ddpjob(namespace: str | None, name: str, type: str, **kwargs: Any) -> None:
    if type != "DELETED":
        reconcile((namespace or "", name), **kwargs)


@kopf.on.event("batch", "v1", "jobs", labels=LABELS)
def on_job(namespace: str | None, labels: kopf.Labels, **kwargs: Any) -> None:
    reconcile(_owner(namespace, labels), **kwargs)


@kopf.on.event("v1", "pods", labels=LABELS)
def on_pod(namespace: str | None, labels: kopf.Labels, **kwargs: Any) -> None:
    reconcile(_owner(namespace, labels), **kwargs)


def _watched(spec: kopf.Spec, status: kopf.Status, **_: Any) -> bool:
    """Finished DDPJobs need no timer, unless their ttlSecondsAfterFinished is still running."""
    return status.get("phase") not in TERMINAL or spec.get("ttlSecondsAfterFinished") is not None


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
    logger: logging.Logger | kopf.ObjectLogger,
    **_: Any,
) -> None:
    with _LOCKS[key]:
        bodies = list(ddpjob_bodies.get(key, []))
        if not bodies:
            return
        body = bodies[0]
        started = time.monotonic()
        result = "error"
        try:
            plan = plan_for(body, list(ddpjob_jobs.get(key, [])), list(ddpjob_pods.get(key, [])))
            try:
                carry_out(body, plan, logger)
            except ApiException as exc:
                # Say so on the DDPJob itself (the API server folds repeats into one event with a count).
                reason = f"the API server refused a step of the plan: {exc.status} {exc.reason}"
                kopf.event(dict(body), type="Warning", reason="ReconcileFailed", message=reason)  # type: ignore[arg-type]
                raise
            opmetrics.observe_plan(body, plan)
            result = "ok"
        finally:
            opmetrics.observe_reconcile(result, time.monotonic() - started, ddpjob_bodies)


def plan_for(body: Mapping[str, Any], jobs: list[dict[str, Any]], pods: list[dict[str, Any]]) -> status.Plan:
    """The plan for one DDPJob; a spec the API server should have refused fails it, with the reasons."""
    previous = dict(body.get("status") or {})
    generation = int(body.get("metadata", {}).get("generation") or 0)
    now = dt.datetime.now(dt.UTC)
    try:
        spec = parse(body, admitted=True)
    except SpecError as exc:
        message = "; ".join(str(problem) for problem in exc.problems)[:1024]
        failed = {
            **previous,
            "phase": "Failed",
            "observedGeneration": generation,
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "InvalidSpec",
                    "message": message,
                    "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
            ],
        }
        return status.Plan(failed, events=(status.Event("Warning", "InvalidSpec", message),))
    return status.reconcile(status.Observed(spec, generation, previous, jobs, pods, now))


def _ignore(codes: tuple[int, ...], call: Any, *args: Any, **kwargs: Any) -> None:
    try:
        call(*args, **kwargs)
    except ApiException as exc:
        if exc.status not in codes:
            raise


def carry_out(body: Mapping[str, Any], plan: status.Plan, logger: logging.Logger | kopf.ObjectLogger) -> None:
    """Apply a plan: children first, then the status, then the events."""
    metadata = body["metadata"]
    namespace, name = metadata["namespace"], metadata["name"]
    core, batch = kubernetes.client.CoreV1Api(), kubernetes.client.BatchV1Api()
    objects = kubernetes.client.CustomObjectsApi()
    for job_name in plan.delete_jobs:
        logger.info(f"deleting Job {job_name} and its pods")
        _ignore((404,), batch.delete_namespaced_job, job_name, namespace, propagation_policy="Foreground")
    if plan.create_service is not None:
        _ignore((409,), core.create_namespaced_service, namespace, plan.create_service)
    if plan.create_job is not None:
        logger.info(f"creating Job {plan.create_job['metadata']['name']}")
        _ignore((409,), batch.create_namespaced_job, namespace, plan.create_job)
    if plan.suspend_job is not None:
        job_name, suspend = plan.suspend_job
        _ignore((404,), batch.patch_namespaced_job, job_name, namespace, {"spec": {"suspend": suspend}})
    if plan.status != body.get("status"):
        _ignore(
            (404,),
            objects.patch_namespaced_custom_object_status,
            crd.GROUP,
            crd.VERSION,
            namespace,
            crd.PLURAL,
            name,
            {"status": plan.status},
        )
    for event in plan.events:
        kopf.event(dict(body), type=event.type, reason=event.reason, message=event.message)  # type: ignore[arg-type]
    if plan.delete_self:
        logger.info("ttlSecondsAfterFinished has passed: deleting the DDPJob")
        _ignore(
            (404,),
            objects.delete_namespaced_custom_object,
            crd.GROUP,
            crd.VERSION,
            namespace,
            crd.PLURAL,
            name,
        )
