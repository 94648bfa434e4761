"""An elastic job's rendezvous store, one room of the decision: what the DDPJob says of it, and when its
Job goes. Pure.

An elastic job whose pods rendezvous through a store of its own (``children/store_job.py``: one pod, one Job
per attempt) needs it while the attempt runs. Here:

- :func:`reading`: whether the store serves, as its pods say (:mod:`ddp_operator.observe.store_health`);
- :func:`to_create`: the store's Job, created with the attempt's;
- :func:`with_stores`: the ``RendezvousStoreReady`` condition on a job that has not finished, a Warning
  event when the store stops serving for a fault of its pod (once per cause), a Normal one when it serves
  again; and the store's Job deleted with its attempt's Job, and when the DDPJob finishes (a pod that
  starts late finds it until then: the rendezvous closed, it ends at once).

:mod:`ddp_operator.decide.decision` asks it only for a job with such a store (``render.external_store``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ddp_operator.api import reasons
from ddp_operator.api.spec import Spec
from ddp_operator.api.typed_status import Status
from ddp_operator.children.store_job import render_store, store_of
from ddp_operator.decide.plan import Event, Obj, Plan
from ddp_operator.decide.status_builder import Said, StatusBuilder, finished
from ddp_operator.observe import store_health
from ddp_operator.observe.facts import Facts, JobFacts


def reading(
    facts: Facts, store_pods: Sequence[Mapping[str, Any]], last: Status
) -> store_health.StoreReading | None:
    """Whether the store of the attempt (``facts.attempt``) serves, as its pods say and as the condition says
    it after the one the previous status (``last``) said; None before the attempt's Job."""
    if facts.job is None:
        return None
    before = last.condition(reasons.RENDEZVOUS_STORE_READY)
    store = store_of(facts.job.name)
    return store_health.read(store_pods, facts.attempt, store, before.reason if before else None)


def to_create(spec: Spec, attempt: int) -> Obj:
    """The store's Job of ``attempt``, rendered, created with the attempt's Job."""
    return render_store(spec, attempt)


def with_stores(
    plan: Plan,
    out: StatusBuilder,
    job: JobFacts | None,
    store: store_health.StoreReading | None,
) -> Plan:
    """``plan`` with the store's condition and events (:func:`said`, through ``out``, the builder that made
    ``plan``), and the store Jobs that go: those of the Jobs the plan deletes or abandons, and the current
    one's when the DDPJob finishes now."""
    done = finished(plan.status)
    if store is not None and not done:
        plan = out.add_to(plan, said(store))
    ending = [*plan.delete_jobs, *plan.abandon_jobs]
    if job is not None and done and not finished(out.last):  # finishing now
        ending.append(job.name)
    stores = tuple(dict.fromkeys(store_of(name) for name in ending))
    return dataclasses.replace(plan, delete_jobs=(*plan.delete_jobs, *stores)) if stores else plan


def said(reading: store_health.StoreReading) -> Said:
    """The store's condition on a job that has not finished, a Warning event when it stops serving for a
    fault of its pod (lost, unschedulable, a container that cannot start; once per cause), and a Normal one
    when it serves again after one (``reading.before``: the reason the previous status said)."""
    before = reading.before
    events: tuple[Event, ...] = ()
    if reading.fault and before != reading.reason:
        events = (Event("Warning", reading.reason, reading.message),)
    elif reading.serving and before in store_health.FAULTS:
        events = (Event("Normal", reading.reason, f"the rendezvous store serves again: {reading.message}"),)
    kind = reasons.RENDEZVOUS_STORE_READY
    return Said(conditions=((kind, reading.serving, reading.reason, reading.message),), events=events)
