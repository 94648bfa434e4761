"""One reconcile of a DDPJob as the runtime does it, on objects built here (a DDPJob body, its Job and
pods at an attempt): the operator's unit tests of decisions, faults and restarts share them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ddp_operator.api import names
from ddp_operator.api.spec import Spec, SpecError, parse
from ddp_operator.children import render
from ddp_operator.decide import decision
from ddp_operator.decide.plan import Plan
from ddp_operator.observe import claims, live
from ddp_operator.observe.observation import Observation

NOW = dt.datetime(2026, 11, 22, 12, 0, 0, tzinfo=dt.UTC)


def ddpjob_body(previous: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ddpjob.io/v1alpha1",
        "kind": "DDPJob",
        "metadata": {"name": "job", "namespace": "ns", "generation": 3},
        "spec": {"nodes": 2, "procsPerNode": 2, "device": "cpu", "maxRestarts": 2, **extra},
        "status": previous or {},
    }


def spec_of(**extra: Any) -> Any:
    return parse(ddpjob_body(**extra))


def job_object(
    attempt: int, *, condition: str | None = None, reason: str = "", suspend: bool = False
) -> dict[str, Any]:
    job = render.render_job(spec_of(), attempt)
    job["spec"]["suspend"] = suspend
    if condition:
        job["status"] = {
            "conditions": [{"type": condition, "status": "True", "reason": reason, "message": reason}]
        }
    return job


def pod_object(
    attempt: int,
    index: int,
    *,
    phase: str = "Running",
    ready: bool = True,
    exit_code: int | None = None,
    message: str | None = None,
    unschedulable: str | None = None,
) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if unschedulable:
        conditions = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}
        ]
    container: dict[str, Any] = {"name": "trainer", "state": {}}
    if exit_code is not None:
        container["state"] = {
            "terminated": {"exitCode": exit_code, **({"message": message} if message else {})}
        }
    return {
        "metadata": {
            "name": f"job-{attempt}-{index}-abcde",
            "labels": {names.ATTEMPT_LABEL: str(attempt), names.JOB_NAME_LABEL: "job"},
            "annotations": {names.COMPLETION_INDEX_ANNOTATION: str(index)},
        },
        "status": {"phase": phase, "conditions": conditions, "containerStatuses": [container]},
    }


def parse_spec(body: Mapping[str, Any]) -> Spec | SpecError:
    """``body``'s spec as the reconcile parses it for its :class:`Observation`, or why it cannot be read."""
    try:
        return parse(body, admitted=True)
    except SpecError as exc:
        return exc


def observed(
    body: Mapping[str, Any],
    jobs: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    now: dt.datetime,
    snapshot: live.Snapshot | None = None,
    claim: claims.ClaimReading | None = None,
    workloads: Mapping[str, Mapping[str, Any]] | None = None,
    mount_events: Sequence[Mapping[str, Any]] = (),
    missing: Collection[tuple[str, str]] = (),
    unhealthy: Mapping[str, str] | None = None,
    store_pods: Sequence[Mapping[str, Any]] = (),
) -> Observation:
    """The :class:`Observation` a reconcile would read: ``body`` with its spec parsed as the runtime parses
    it, and these readings."""
    spec = parse_spec(body)
    return Observation(
        body, spec, jobs, pods, now, snapshot, claim, workloads, mount_events, missing, unhealthy, store_pods
    )


def reconcile_once(
    previous: dict[str, Any] | None = None,
    jobs: list[Any] | None = None,
    pods: list[Any] | None = None,
    now: dt.datetime = NOW,
    **spec: Any,
) -> Plan:
    return decision.decide(observed(ddpjob_body(previous, **spec), jobs or [], pods or [], now))
