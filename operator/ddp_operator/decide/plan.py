"""A reconcile's result: the ``Plan`` (status to write, children to create or delete, events to post,
metrics to read). Pure values; :mod:`ddp_operator.decide.decision` decides it, the status built through
:mod:`ddp_operator.decide.status_builder`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddp_operator.observe.live import Target

Obj = dict[str, Any]


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Scrape:
    """Read these pods' metrics in the background (the job runs); the next reconcile gets the reading."""

    attempt: int
    port: int
    targets: tuple[Target, ...]


@dataclass(frozen=True)
class Plan:
    status: Obj
    create_claim: Obj | None = None  # the checkpoint PersistentVolumeClaim, before the pods that mount it
    create_service: Obj | None = None  # created (or found already there) before create_job
    create_job: Obj | None = None
    create_store: Obj | None = None  # an elastic job's rendezvous store Job, created just before create_job
    delete_jobs: tuple[str, ...] = ()
    abandon_jobs: tuple[str, ...] = ()  # deleted without waiting for pods whose node does not answer
    suspend_job: tuple[str, bool] | None = None
    resize_job: tuple[str, int] | None = None  # an elastic job's Job: completions = parallelism = this
    events: tuple[Event, ...] = ()
    delete_self: bool = False  # ttlSecondsAfterFinished has passed
    mark_faulty: tuple[tuple[str, str, str], ...] = ()  # (node, device, why): a faulty rank's (--node-health)
    scrape: Scrape | None = None  # None: the job does not run; forget its metrics
