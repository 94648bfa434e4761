"""Plans → API calls: the operator's only writes. The I/O edge of reconcile.

Carrying out a plan is idempotent (create ignores AlreadyExists, delete ignores NotFound), so concurrent
or repeated reconciles and operator restarts never duplicate children.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import kopf
import kubernetes
from kubernetes.client.exceptions import ApiException

from . import crd, opmetrics
from .plan import Plan
from .reconcile import plan_for, refused
from .scraper import Scraper

Logger = logging.Logger | kopf.ObjectLogger


def reconcile(
    body: Mapping[str, Any],
    jobs: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    logger: Logger,
    all_bodies: Mapping[Any, Iterable[Mapping[str, Any]]],
    scraper: Scraper | None = None,
) -> None:
    """Decide (pure) and carry out the plan for one DDPJob; record the reconcile's metrics. ``scraper``
    holds the latest reading of the pods' metrics and takes the plan's next read (in the background)."""
    started = time.monotonic()
    result = "error"
    key = (body["metadata"].get("namespace") or "", body["metadata"]["name"])
    try:
        snapshot = scraper.latest(key) if scraper else None
        plan = plan_for(body, jobs, pods, dt.datetime.now(dt.UTC), snapshot)
        if scraper is not None:
            if plan.scrape is None:
                scraper.forget(key)
            else:
                scraper.want(key, plan.scrape.attempt, plan.scrape.port, plan.scrape.targets)
        try:
            try:
                carry_out(body, plan, logger)
            except Refused as exc:
                logger.error(f"not creating anything: {exc}")
                status = dict(body.get("status") or {})
                generation = int(body["metadata"].get("generation") or 0)
                plan = refused(str(exc), status, generation, dt.datetime.now(dt.UTC))
                carry_out(body, plan, logger)
        except ApiException as exc:
            # Say so on the DDPJob itself (the API server folds repeats into one event with a count).
            reason = f"the API server refused a step of the plan: {exc.status} {exc.reason}"
            _event(body, "Warning", "ReconcileFailed", reason)
            raise
        opmetrics.observe_plan(body, plan)
        result = "ok"
    finally:
        opmetrics.observe_reconcile(result, time.monotonic() - started, all_bodies)


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386) that turns ``old`` into ``new``: keys ``new`` dropped become null
    (a merge patch keeps what it does not name, so a field once written would otherwise stay forever)."""
    out: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            out[key] = merge_patch(before, value)
        else:
            out[key] = value
    return out


def _ignore(codes: tuple[int, ...], call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    try:
        call(*args, **kwargs)
    except ApiException as exc:
        if exc.status not in codes:
            raise


def _event(body: Mapping[str, Any], type: str, reason: str, message: str) -> None:
    kopf.event(dict(body), type=type, reason=reason, message=message)  # type: ignore[arg-type]


class Refused(Exception):
    """The API server refuses the Job a plan would create (its dry run said so): nothing was created."""


def _dry_run(batch: Any, namespace: str, job: Mapping[str, Any]) -> None:
    """Creates ``job`` as a dry run (admission and validation, nothing stored), so that a Job the API
    server refuses leaves no Service or claim behind; raises :class:`Refused` with the server's words."""
    try:
        batch.create_namespaced_job(namespace, job, dry_run="All")
    except ApiException as exc:
        if exc.status == 409:  # it exists already: the real create below ignores that too
            return
        if exc.status in (400, 422):
            try:
                message = str(json.loads(exc.body or "{}").get("message") or exc.reason)
            except ValueError:
                message = str(exc.body or exc.reason)
            raise Refused(message) from None
        raise


def carry_out(body: Mapping[str, Any], plan: Plan, logger: Logger) -> None:
    """Apply a plan: children first, then the status, then the events."""
    metadata = body["metadata"]
    namespace, name = metadata["namespace"], metadata["name"]
    core, batch = kubernetes.client.CoreV1Api(), kubernetes.client.BatchV1Api()
    objects = kubernetes.client.CustomObjectsApi()
    custom = (crd.GROUP, crd.VERSION, namespace, crd.PLURAL, name)
    if plan.create_job is not None:
        _dry_run(batch, namespace, plan.create_job)
    for job_name in plan.delete_jobs:
        logger.info(f"deleting Job {job_name} and its pods")
        _ignore((404,), batch.delete_namespaced_job, job_name, namespace, propagation_policy="Foreground")
    for job_name in plan.abandon_jobs:  # a second delete, in the background, drops the foreground wait
        logger.info(f"deleting Job {job_name} without waiting for its pods on a node that does not answer")
        _ignore((404,), batch.delete_namespaced_job, job_name, namespace, propagation_policy="Background")
    if plan.create_claim is not None:
        logger.info(f"creating PersistentVolumeClaim {plan.create_claim['metadata']['name']} for checkpoints")
        _ignore((409,), core.create_namespaced_persistent_volume_claim, namespace, plan.create_claim)
    if plan.create_service is not None:
        _ignore((409,), core.create_namespaced_service, namespace, plan.create_service)
    if plan.create_job is not None:
        logger.info(f"creating Job {plan.create_job['metadata']['name']}")
        _ignore((409,), batch.create_namespaced_job, namespace, plan.create_job)
    if plan.suspend_job is not None:
        job_name, suspend = plan.suspend_job
        _ignore((404,), batch.patch_namespaced_job, job_name, namespace, {"spec": {"suspend": suspend}})
    if plan.status != body.get("status"):
        patch = {"status": merge_patch(body.get("status") or {}, plan.status)}
        _ignore((404,), objects.patch_namespaced_custom_object_status, *custom, patch)
    for event in plan.events:
        _event(body, event.type, event.reason, event.message)
    if plan.delete_self:
        logger.info("ttlSecondsAfterFinished has passed: deleting the DDPJob")
        _ignore((404,), objects.delete_namespaced_custom_object, *custom)
