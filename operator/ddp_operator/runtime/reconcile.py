"""Plans → API calls: the operator's only writes. The I/O edge of reconcile.

Carrying out a plan is idempotent (create ignores AlreadyExists, delete ignores NotFound), so concurrent
or repeated reconciles and operator restarts never duplicate children. What it wrote is remembered
(:class:`~ddp_operator.runtime.recent.Recent`) until the watches show it, so the next reconcile decides from
it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import kopf
import kubernetes
from kubernetes.client.exceptions import ApiException

from ddp_operator.api import crd, reasons
from ddp_operator.api.spec import Spec, SpecError, parse
from ddp_operator.decide.decision import decide, refused
from ddp_operator.decide.plan import Plan
from ddp_operator.observe.observation import Observation
from ddp_operator.runtime import nodes, opmetrics
from ddp_operator.runtime.reads import api_client, ignore, read_all
from ddp_operator.runtime.recent import Recent, views
from ddp_operator.runtime.scraper import Scraper
from ddp_operator.runtime.slim import slim_job

Logger = logging.Logger | kopf.ObjectLogger
MARK_FAULTY_NODES = False
"""``--node-health``: a faulty rank's node is tainted (:mod:`ddp_operator.runtime.nodes`)."""


def reconcile(
    body: Mapping[str, Any],
    jobs: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    logger: Logger,
    scraper: Scraper | None = None,
    recent: Recent | None = None,
    workloads: Mapping[str, Mapping[str, Any]] | None = None,
    unhealthy: Mapping[str, str] | None = None,
    store_pods: Sequence[Mapping[str, Any]] = (),
) -> None:
    """Read one :class:`Observation` of a DDPJob (its spec parsed once), decide (pure) and carry out the
    plan; record the reconcile's metrics. ``workloads``: Kueue's Workloads of its Jobs, by Job name.
    ``scraper`` holds the latest reading of the pods' metrics and takes the plan's next read (in the
    background); ``recent`` holds what earlier reconciles wrote that ``body`` and ``jobs`` (the indexes)
    lack; ``unhealthy``: the nodes whose GPUs are marked unhealthy (``--node-health``), which new attempts
    avoid; ``store_pods``: an elastic job's rendezvous store pods."""
    started = time.monotonic()
    done: Plan | None = None  # the plan carried out, counted with the reconcile
    key = (body["metadata"].get("namespace") or "", body["metadata"]["name"])
    try:
        recent, body, jobs, pods = views(recent, key, body, jobs, pods, started)
        snapshot = scraper.latest(key) if scraper else None
        now = dt.datetime.now(dt.UTC)
        try:  # once per reconcile: the spec that reads and the decision go by
            spec: Spec | SpecError = parse(body, admitted=True)
        except SpecError as exc:
            spec = exc  # the decision fails the DDPJob, saying why (InvalidSpec)
        claim, events, missing = read_all(body, jobs, pods, now, spec)
        observed = Observation(
            body=body,
            spec=spec,
            jobs=jobs,
            pods=pods,
            now=now,
            snapshot=snapshot,
            claim=claim,
            workloads=workloads,
            mount_events=events,
            missing=missing,
            unhealthy=unhealthy or {},
            store_pods=store_pods,
        )
        plan = decide(observed)
        _scrape(scraper, key, plan)
        try:
            try:
                carry_out(body, plan, logger, recent)
            except Refused as refusal:
                generation = int(body["metadata"].get("generation") or 0)
                plan = refused(dict(body.get("status") or {}), generation, now, str(refusal))
                _scrape(scraper, key, plan)
                carry_out(body, plan, logger, recent)
        except ApiException as exc:
            # Say so on the DDPJob itself (the API server folds repeats into one event with a count).
            reason = f"the API server refused a step of the plan: {exc.status} {exc.reason}"
            _event(body, "Warning", reasons.RECONCILE_FAILED, reason)
            raise
        done = plan
    finally:
        result = "ok" if done is not None else "error"
        opmetrics.observe_reconcile(result, time.monotonic() - started, body, done)


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


def _event(body: Mapping[str, Any], type: str, reason: str, message: str) -> None:
    kopf.event(dict(body), type=type, reason=reason, message=message)  # type: ignore[arg-type]


class Refused(Exception):
    """The API server refused (400, 422) an object the plan creates: a spec the CRD could not refuse. The
    message names the object and gives the server's own words."""

    @classmethod
    def of(cls, obj: Mapping[str, Any], exc: ApiException) -> Refused:
        kind, name = obj["kind"], obj["metadata"]["name"]
        return cls(f"the API server refuses the {kind} {name} this spec renders: {_server_message(exc)}")


def _scrape(scraper: Scraper | None, key: tuple[str, str], plan: Plan) -> None:
    if scraper is None:
        return
    if plan.scrape is None:
        scraper.forget(key)
    else:
        scraper.want(key, plan.scrape.attempt, plan.scrape.port, plan.scrape.targets)


def _create_children(namespace: str, plan: Plan, logger: Logger) -> dict[str, Any] | None:
    """Create the plan's claim, Service and Job, in that order (one that exists already is left as it is);
    the Job as the server stored it, or None. A refusal (:class:`Refused`) leaves nothing half-way:

    * the Service this call created is deleted again when the server refuses the Job after it. No ``dryRun``
      first: asking the server twice for every attempt was a third of the API requests of a thousand
      DDPJobs created at once, and their p50 create → children went from 2–4 s to 0.5 s without it;
    * a claim is never deleted by the operator (it holds checkpoints; the chart grants no such verb), so an
      attempt that creates one is asked of the server with ``dryRun`` first, Service and Job, before it."""
    client = api_client()
    core, batch = kubernetes.client.CoreV1Api(client), kubernetes.client.BatchV1Api(client)
    if plan.create_claim is not None:
        _create(core.create_namespaced_service, namespace, plan.create_service, dry_run="All")
        _create(batch.create_namespaced_job, namespace, plan.create_job, dry_run="All")
        logger.info(f"creating PersistentVolumeClaim {plan.create_claim['metadata']['name']} for checkpoints")
        _create(core.create_namespaced_persistent_volume_claim, namespace, plan.create_claim)
    service = _create(core.create_namespaced_service, namespace, plan.create_service)  # None: not new
    if plan.create_job is None:
        return None
    if plan.create_store is not None:  # an elastic job's rendezvous store: before the pods that connect
        logger.info(f"creating Job {plan.create_store['metadata']['name']} (the rendezvous store)")
    store = _create(batch.create_namespaced_job, namespace, plan.create_store)  # None: not new, or none
    logger.info(f"creating Job {plan.create_job['metadata']['name']}")
    try:
        job: dict[str, Any] | None = _create(batch.create_namespaced_job, namespace, plan.create_job)
        return job
    except Refused:
        if store is not None:
            name = store["metadata"]["name"]
            logger.info(f"deleting Job {name}: the API server refuses the Job that follows it")
            ignore((404,), batch.delete_namespaced_job, name, namespace, propagation_policy="Background")
        if service is not None:
            name = service["metadata"]["name"]
            logger.info(f"deleting Service {name}: the API server refuses the Job that follows it")
            ignore((404,), core.delete_namespaced_service, name, namespace)
        raise


def _create(create: Callable[..., Any], namespace: str, obj: Mapping[str, Any] | None, **options: Any) -> Any:
    """The server's answer to creating ``obj`` (parsed; None where there is no ``obj`` or it exists
    already); :class:`Refused` where the server refuses it (400, 422)."""
    if obj is None:
        return None
    try:
        return ignore((409,), create, namespace, obj, **options)
    except ApiException as exc:
        if exc.status in (400, 422):
            raise Refused.of(obj, exc) from exc
        raise


def _server_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return f"{exc.status} {exc.reason}"


def carry_out(body: Mapping[str, Any], plan: Plan, logger: Logger, recent: Recent) -> None:
    """Apply a plan: children first, then the status, then the events; tell ``recent`` what was written."""
    metadata = body["metadata"]
    namespace, name = metadata["namespace"], metadata["name"]
    key = (namespace, name)
    client = api_client()
    batch, objects = kubernetes.client.BatchV1Api(client), kubernetes.client.CustomObjectsApi(client)
    custom = (crd.GROUP, crd.VERSION, namespace, crd.PLURAL, name)
    for job_name in plan.delete_jobs:
        logger.info(f"deleting Job {job_name} and its pods")
        ignore((404,), batch.delete_namespaced_job, job_name, namespace, propagation_policy="Foreground")
        recent.deleted(key, job_name)
    for job_name in plan.abandon_jobs:  # a second delete, in the background, drops the foreground wait
        logger.info(f"deleting Job {job_name} without waiting for its pods on a node that does not answer")
        ignore((404,), batch.delete_namespaced_job, job_name, namespace, propagation_policy="Background")
    if created := _create_children(namespace, plan, logger):
        recent.created(key, created, time.monotonic())
    if plan.resize_job is not None:  # an elastic job: the same Indexed Job, another size
        job_name, node_count = plan.resize_job
        size = {"spec": {"completions": node_count, "parallelism": node_count}}
        if resized := ignore((404,), batch.patch_namespaced_job, job_name, namespace, size):
            recent.job_patched(key, slim_job(resized), time.monotonic())
    if plan.suspend_job is not None:
        job_name, suspend = plan.suspend_job
        switch = {"spec": {"suspend": suspend}}
        if switched := ignore((404,), batch.patch_namespaced_job, job_name, namespace, switch):
            recent.job_patched(key, slim_job(switched), time.monotonic())
    for node, device, message in plan.mark_faulty if MARK_FAULTY_NODES else ():
        if failed := nodes.mark_faulty(node, device, message, f"DDPJob {namespace}/{name}"):
            _event(body, "Warning", reasons.NODE_NOT_MARKED, failed)
    if plan.status != body.get("status"):
        patch = {"status": merge_patch(body.get("status") or {}, plan.status)}
        if patched := ignore((404,), objects.patch_namespaced_custom_object_status, *custom, patch):
            recent.patched(key, patched)
    for event in plan.events:
        _event(body, event.type, event.reason, event.message)
    if plan.delete_self:
        logger.info("ttlSecondsAfterFinished has passed: deleting the DDPJob")
        ignore((404,), objects.delete_namespaced_custom_object, *custom)
