"""Facts → the next step for a DDPJob, and its phase. Pure: one function of what is observed.

:func:`decide` takes the reconcile's :class:`~ddp_operator.observe.observation.Observation` (the DDPJob, its
spec parsed once, its children and the other readings), reads the children into
:class:`~ddp_operator.observe.facts.Facts`, renders the objects of the current attempt (a value the plan
may carry, never something the decision asks for midway), picks exactly one branch below and returns a
:class:`Plan`: the status to write, the Service and Job to create, the Jobs to delete, the Job to
(un)suspend, the events to post. :mod:`ddp_operator.runtime.reconcile` builds the observation and carries
plans out; every branch here is unit-tested without an API server
(``tests/unit/operator/runtime/test_reconcile.py``) and proven against one by the e2e tests.

This module is the phase machine: which branch applies, in the order the branches are checked, and which
rooms apply to the job (an elastic job's, Kueue's). Each branch says its phase and ``Ready`` condition;
:mod:`~ddp_operator.decide.status` begins and ends the status, and each feature's rules live in a room of
its own under ``decide/``: :mod:`~ddp_operator.decide.restarts`, :mod:`~ddp_operator.decide.checkpoints`,
:mod:`~ddp_operator.decide.compute_probe`, :mod:`~ddp_operator.decide.sync_check`,
:mod:`~ddp_operator.decide.progress` (with a stall), :mod:`~ddp_operator.decide.kueue`,
:mod:`~ddp_operator.decide.starting`, and an elastic job's :mod:`~ddp_operator.decide.resize`,
:mod:`~ddp_operator.decide.ending` and :mod:`~ddp_operator.decide.rendezvous_store`.

Long because every branch of the decision reads best in one place, in the order the branches are checked.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ddp_operator.api import names, reasons
from ddp_operator.api.spec import Spec, SpecError, known_total_steps
from ddp_operator.children import render
from ddp_operator.decide import (
    checkpoints,
    compute_probe,
    ending,
    kueue,
    progress,
    rendezvous_store,
    resize,
    restarts,
    starting,
    status,
    sync_check,
)
from ddp_operator.decide.plan import Event, Plan, Scrape
from ddp_operator.decide.status_builder import Said, StatusBuilder, count, finished, parse_time, stamp
from ddp_operator.observe import claims, live, references, store_health
from ddp_operator.observe.facts import STOP_MARGIN_SECONDS, Facts, JobFacts, observe
from ddp_operator.observe.observation import Observation
from ddp_trainer import contract

STALLED = reasons.STALLED


@dataclass(frozen=True)
class Inputs:
    """What :func:`decide` makes of an :class:`Observation` before it picks a branch."""

    spec: Spec
    generation: int
    previous: Mapping[str, Any]
    """The DDPJob's last written status."""
    facts: Facts
    now: dt.datetime
    service: dict[str, Any] | None
    """The headless Service, rendered when the attempt has no Job yet (created with it)."""
    claim: dict[str, Any] | None
    """The checkpoint PersistentVolumeClaim, rendered, when spec.checkpoint.volumeClaimTemplate asks."""
    job: dict[str, Any] | None
    """The Job of ``facts.attempt``, rendered where it is needed (no Job yet, the starting room, a claim)."""
    snapshot: live.Snapshot | None = None
    """The latest reading of the pods' metrics (:mod:`ddp_operator.runtime.scraper`), if any."""
    storage: claims.Diagnosis | None = None
    """Why the checkpoint claim keeps the pods from starting, when the claim was read and something does."""
    workloads: Mapping[str, Mapping[str, Any]] | None = None
    """Kueue's Workloads of the DDPJob's Jobs, by Job name (read by Kueue's room: :func:`kueue.said`)."""
    store: store_health.StoreReading | None = None
    """An elastic job's rendezvous store, as its pods say (None: the job has none, or no attempt yet)."""


def decide(observation: Observation) -> Plan:
    """The plan for one DDPJob, one pure function of what the reconcile observed (:class:`Observation`):
    the spec as parsed (an unreadable one fails the DDPJob: :func:`invalid_spec`), the Jobs and pods read
    into :class:`Facts`, the attempt's objects rendered where needed, the readings (the claim, an elastic
    job's rendezvous store; Kueue's Workload, in its room) interpreted, then exactly one branch
    (:func:`_decide`), with an elastic job's rendezvous stores (:mod:`~.rendezvous_store`)."""
    body, now = observation.body, observation.now
    out = StatusBuilder.for_body(body, now)
    previous = out.previous
    generation = int(body.get("metadata", {}).get("generation") or 0)
    if isinstance(observation.spec, SpecError):
        return invalid_spec(observation.spec, previous, generation, now)
    last = out.last  # the previous status, typed
    spec, mount_events = observation.spec, observation.mount_events
    refs, elastic = references.references(spec), spec.elastic is not None
    facts = observe(
        previous, observation.jobs, observation.pods, spec.metrics_port, refs, mount_events, elastic
    )
    budget = restarts.budget(out, spec.max_restarts, facts, observation.snapshot)
    # the starting room applies where there is a failure to find: Pod Security's events, a missing reference
    to_find = facts.startup is None and bool(mount_events or observation.missing)
    service, job, rendered = None, None, None
    # the attempt's objects, where needed: to create them (no Job yet), for the starting room, a claim read
    if facts.job is None or to_find or observation.claim is not None:
        avoid = []  # the compute probe's room applies once it found a faulty node, or nodes are unhealthy
        if last.probe is not None or observation.unhealthy:
            avoid = compute_probe.nodes_to_avoid(last, observation.unhealthy)
        service, job, rendered = render.render_attempt(
            spec, facts.attempt, budget.left, avoid, service=facts.job is None
        )
    if to_find and job is not None:
        facts = starting.refused_or_absent(facts, spec, job, mount_events, observation.missing, refs)
    why = None  # a claim read: what keeps the pods from it
    if observation.claim is not None:
        why = claims.diagnose(observation.claim, owned=rendered is not None, nodes=spec.nodes)
    # an elastic job's own rendezvous store: its room applies
    stored = elastic and render.external_store(spec)
    store = rendezvous_store.reading(facts, observation.store_pods, last) if stored else None
    snapshot, workloads = observation.snapshot, observation.workloads
    inputs = Inputs(
        spec, generation, previous, facts, now, service, rendered, job, snapshot, why, workloads, store
    )
    plan = _decide(inputs, out, budget)
    return rendezvous_store.with_stores(plan, out, facts.job, store) if stored else plan


def invalid_spec(error: SpecError, previous: Mapping[str, Any], generation: int, now: dt.datetime) -> Plan:
    """A spec the API server should have refused (a hand-edited object, an older CRD): fail, say why."""
    return refused(previous, generation, now, "; ".join(str(problem) for problem in error.problems))


def refused(previous: Mapping[str, Any], generation: int, now: dt.datetime, message: str) -> Plan:
    """Fail with reason ``InvalidSpec`` and ``message``, creating nothing: a spec this operator cannot read,
    or one whose children the API server refused (``reconcile.carry_out``, which undid what it had
    created)."""
    out = StatusBuilder(previous, stamp(now))
    out.keep_all_but_conditions()
    out.set(observed_generation=generation)
    return _finish(out, False, reasons.INVALID_SPEC, message[:1024])


def _decide(inputs: Inputs, out: StatusBuilder, budget: restarts.Budget) -> Plan:
    """The status to write (``out``: its builder; ``budget``: its ``restarts``, and the restarts in place
    it does not count yet) and the next step: exactly one branch applies, checked in this order."""
    facts, job = inputs.facts, inputs.facts.job
    status.begin(
        out, inputs.generation, facts.attempt, budget.shown, facts.report, inputs.spec, budget.in_place
    )
    if out.last.phase in reasons.TERMINAL and finished(out.last):  # a terminal phase, and believed
        return _finished(inputs, out)
    if (deadline := _deadline_passed(inputs, out)) is not None:
        return _finish(out, False, reasons.DEADLINE_EXCEEDED, deadline, delete=_all_jobs(facts))
    if facts.stale_jobs:
        return _stopping_old_attempts(inputs, out)
    if job is None:
        return _create(inputs, out)
    elastic = inputs.spec.elastic is not None  # the elastic rooms apply
    if elastic and (end := ending.attempt_end(inputs.spec, job, facts.report, inputs.now)) is not None:
        return _elastic_ended(inputs, out, job, end)
    if job.complete:  # a rigid job's Job: every pod succeeded
        return _completed(inputs, out)
    if job.failed:
        return _after_failure(inputs, out, job)
    return _running(inputs, out, job)


def _completed(inputs: Inputs, out: StatusBuilder, said: str = "") -> Plan:
    """The attempt completed: Succeeded, with the report's step as the final progress."""
    facts = inputs.facts
    checkpoints.restored_events(out, facts.report)
    steps = facts.report.get("step") if facts.report else None
    if final := progress.final_progress(inputs.previous, steps, known_total_steps(inputs.spec), out.now):
        out.set(progress=final)
    message = progress.completed_message(inputs.previous, facts.attempt, inputs.now, steps)
    return _finish(out, True, reasons.COMPLETED, message + said)


def _elastic_ended(inputs: Inputs, out: StatusBuilder, job: JobFacts, end: ending.End) -> Plan:
    """Succeeded when rank 0's report says the training finished, verified, whatever pods never started
    (the Job is shrunk to index 0, which ends them); else the policy decides, as after a failure: exit
    codes alone never make an elastic job Succeeded."""
    if end.verdict.done:
        plan = _completed(inputs, out, ending.ended_message(end))
        return dataclasses.replace(plan, resize_job=end.shrink) if end.shrink else plan
    why = f"Job {job.name} ended, but {end.verdict.message}"
    outcome = restarts.Outcome(False, report=inputs.facts.report, reason=end.verdict.reason, message=why)
    return _end_attempt(inputs, out, job.name, outcome)


def _all_jobs(facts: Facts) -> tuple[str, ...]:
    return facts.stale_jobs + ((facts.job.name,) if facts.job else ())


def _finished(inputs: Inputs, out: StatusBuilder) -> Plan:
    """A terminal phase sticks; old Jobs go; the DDPJob itself goes once its TTL has passed."""
    status.keep_finished(out)
    finished = parse_time(out.last.completion_time)
    ttl = inputs.spec.ttl_seconds_after_finished
    expired = ttl is not None and finished is not None and (inputs.now - finished).total_seconds() >= ttl
    # an elastic Job shrunk to index 0 as the DDPJob succeeded: again, should that patch not have landed
    succeeded = out.last.phase == reasons.SUCCEEDED
    end = (
        ending.attempt_end(inputs.spec, inputs.facts.job, inputs.facts.report, inputs.now)
        if succeeded
        else None
    )
    shrink = end.shrink if end is not None and end.verdict.done else None
    stale = inputs.facts.stale_jobs
    return Plan(out.plan().status, delete_jobs=stale, delete_self=expired, resize_job=shrink)


def _deadline_passed(inputs: Inputs, out: StatusBuilder) -> str | None:
    deadline = inputs.spec.active_deadline_seconds
    if deadline is None:
        return None
    started = parse_time(out.last.start_time or out.now)
    if started and (inputs.now - started).total_seconds() > deadline:
        return f"ran longer than activeDeadlineSeconds ({deadline}s), restarts included"
    return None


def _stopping_old_attempts(inputs: Inputs, out: StatusBuilder) -> Plan:
    """Old Jobs go (foreground: the next gang starts once their pods are gone), except that a Job whose
    pods were evicted from a lost node, or are past their deletion deadline by ``STOP_MARGIN_SECONDS``, is
    deleted without waiting for them: their node does not answer, and the API server would keep them
    Terminating until it does (``facts.give_up_at``)."""
    attempt = inputs.facts.attempt
    lost = tuple(name for name, give_up in inputs.facts.stale_deadlines if inputs.now >= give_up)
    said = out.said(reasons.READY)
    if out.last.phase == reasons.RESTARTING and said is not None and said.reason and said.message:
        # Why the gang restarts (Stalled, NodeLost, AttemptFailed, ...) stays said until the next attempt.
        out.phase(reasons.RESTARTING, said.reason, said.message)
        out.condition(reasons.READY, False, said.reason, said.message)
    else:
        out.phase(
            reasons.RESTARTING, reasons.GANG_RESTART, f"stopping the pods of attempt(s) before {attempt}"
        )
        out.condition(
            reasons.READY, False, reasons.GANG_RESTART, "waiting for the pods of earlier attempts to go away"
        )
    for name in lost:
        message = (
            f"Job {name}: its pods' node does not answer (evicted from a lost node, or not confirmed "
            f"stopped {STOP_MARGIN_SECONDS}s past their deletion deadline); not waiting for them"
        )
        out.events.append(Event("Warning", reasons.NODE_LOST, message))
    return out.plan(delete_jobs=inputs.facts.stale_jobs, abandon_jobs=lost)


SUSPENDED_READY = "spec.suspend is true"


def _create(inputs: Inputs, out: StatusBuilder) -> Plan:
    spec, attempt, job = inputs.spec, inputs.facts.attempt, inputs.job
    assert job is not None  # rendered: the attempt has no Job
    out.phase(
        reasons.SUSPENDED if spec.suspend else reasons.PENDING,
        reasons.SUSPENDED if spec.suspend else "Created",
        f"created Job {job['metadata']['name']} (attempt {attempt})",
    )
    # Suspended from the start: the status says at once what the next reconcile (the Job there, suspended)
    # would, so that one writes nothing: one event and one status write for a suspended DDPJob's creation.
    if spec.suspend:
        out.condition(reasons.READY, False, reasons.SUSPENDED, SUSPENDED_READY)
    else:
        out.condition(reasons.READY, False, "Creating", f"creating attempt {attempt}")
        if (absent := inputs.facts.startup) is not None:  # created all the same: the objects may come later
            starting.cannot_start(out, absent, inputs.facts.ready_nodes, spec.nodes)
    sync_check.condition(out)
    store = rendezvous_store.to_create(spec, attempt) if render.external_store(spec) else None
    return out.plan(
        create_claim=inputs.claim, create_service=inputs.service, create_job=job, create_store=store
    )


def _after_failure(inputs: Inputs, out: StatusBuilder, job: JobFacts) -> Plan:
    """A failed attempt: the policy chooses between a gang restart and failing the DDPJob, once the
    attempt's pods have stopped (rank 0 reports on its way out: a preemption is told apart from a crash
    only then), or a termination grace period after the failure at the latest."""
    attempt = inputs.facts.attempt
    assert job.outcome is not None
    since = (inputs.now - job.failed_at).total_seconds() if job.failed_at else 0.0
    if job.stopping_pods and since < render.TERMINATION_GRACE_SECONDS + STOP_MARGIN_SECONDS:
        message = (
            f"attempt {attempt} failed; waiting for its {job.stopping_pods} other pod(s) to stop and report"
        )
        out.phase(reasons.RESTARTING, reasons.STOPPING_ATTEMPT, message)
        out.condition(reasons.READY, False, reasons.STOPPING_ATTEMPT, message)
        return out.plan()
    return _end_attempt(inputs, out, job.name, job.outcome)


def _end_attempt(
    inputs: Inputs, out: StatusBuilder, job: str, outcome: restarts.Outcome, stop: bool = False
) -> Plan:
    """The policy's decision on an ended attempt: the next attempt (Job ``job`` goes first), or the
    DDPJob fails (deleting ``job`` too when its pods still run: ``stop``)."""
    attempt = inputs.facts.attempt
    preemptions = count(out.last.preemptions)
    in_place = count(out.current().restarts_in_place)
    decision = restarts.decide(outcome, attempt, inputs.spec.max_restarts, preemptions, in_place)
    checkpoints.restored_events(out, inputs.facts.report)
    faulty: tuple[tuple[str, str, str], ...] = ()
    if decision.reason == contract.FAULTY_RANK:
        faulty = compute_probe.faulty_rank_found(out, outcome)
    if decision.action is restarts.Action.RESTART:
        out.set(attempt=attempt + 1, restarts=restarts.shown(attempt + 1, in_place))
        restarts.recreated(out, attempt + 1, decision.reason, decision.message)
        if decision.reason == restarts.PREEMPTED:
            out.set(preemptions=preemptions + 1)
        out.phase(reasons.RESTARTING, decision.reason, decision.message, warning=True)
        out.condition(reasons.READY, False, decision.reason, decision.message)
        return out.plan(delete_jobs=(job,), mark_faulty=faulty)
    plan = _finish(out, False, decision.reason, decision.message, delete=(job,) if stop else ())
    return dataclasses.replace(plan, mark_faulty=faulty) if faulty else plan


def _running(inputs: Inputs, out: StatusBuilder, job: JobFacts) -> Plan:
    """The attempt's Job exists and has not finished: pending, queued, suspended or running."""
    spec, facts = inputs.spec, inputs.facts
    toggle = None
    if spec.suspend and not job.suspended:
        toggle = (job.name, True)
    elif not spec.suspend and job.suspended and spec.queue_name is None:
        toggle = (job.name, False)
    ready, attempt = facts.ready_nodes, facts.attempt
    # Kueue's room applies to a job that names a queue, entered once; any other has no status.kueue
    queue = kueue.said(spec, job, inputs.workloads) if spec.queue_name else None
    said = [Said(dict(ready_nodes=ready)), queue.status if queue is not None else Said(drop=("kueue",))]
    if spec.suspend:
        message = "suspended: the pods are stopped and the checkpoint is kept"
        said.append(_said(reasons.SUSPENDED, reasons.SUSPENDED, message, False, SUSPENDED_READY))
    elif job.suspended and spec.queue_name is None:
        message = f"Job {job.name} is still suspended"
        said.append(_said(reasons.PENDING, "Resuming", f"resuming Job {job.name}", False, message))
    elif queue is not None and queue.waiting is not None:  # the Job suspended for Kueue
        said.append(queue.waiting)
    elif ready == spec.nodes:
        message = f"all {spec.nodes} pods of attempt {attempt} are running"
        ready_message = f"{ready}/{spec.nodes} pods ready"
        said.append(_said(reasons.RUNNING, reasons.ALL_NODES_READY, message, True, ready_message))
    elif spec.elastic is not None and ready >= spec.elastic.min_nodes:
        gated = queue.gate if queue is not None else ""
        message = (
            f"training at {ready} of {spec.nodes} desired nodes (elastic: "
            f"{spec.elastic.min_nodes}-{spec.elastic.max_nodes}); the others join at a step boundary{gated}"
        )
        ready_message = f"{ready}/{spec.nodes} pods ready{gated}"
        said.append(_said(reasons.RUNNING, reasons.BELOW_DESIRED, message, True, ready_message))
    elif (short := resize.below_min(spec, out.last, ready, inputs.now)) is not None:
        message = short.message(spec, facts.unschedulable)
        if short.over:
            out.say(*said)
            outcome = restarts.Outcome(False, reason=reasons.BELOW_MIN_NODES, message=message)
            if (
                sized := resize.of_reading(spec, job, out, ready, inputs.now, inputs.snapshot, attempt)
            ) is not None:
                out.set(elastic=sized.status)
            return _end_attempt(inputs, out, job.name, outcome, True)
        said.append(_said(reasons.RUNNING, reasons.BELOW_MIN_NODES, message, False, message, warning=True))
    else:  # the pods are starting, or cannot
        out.say(*said)
        said = []
        starting.say_starting(out, spec, facts, inputs.storage)
    out.say(*said)
    enough = spec.elastic.min_nodes if spec.elastic is not None else spec.nodes
    running = ready >= enough and not spec.suspend and not job.suspended
    if why := progress.stall_or_reading(out, spec, inputs.snapshot, attempt, inputs.now, running):
        return _end_attempt(inputs, out, job.name, restarts.Outcome(False, reason=STALLED, message=why), True)
    scrape = None
    if facts.targets and not spec.suspend and not job.suspended:
        scrape = Scrape(attempt, spec.metrics_port, facts.targets)
    verified = Said(conditions=(sync_check.verified(out.current()),))
    elastic = spec.elastic is not None  # the elastic room applies
    if (
        not elastic
        or (sized := resize.of_reading(spec, job, out, ready, inputs.now, inputs.snapshot, attempt)) is None
    ):
        return out.plan(verified, suspend_job=toggle, scrape=scrape)
    selector = f"{names.JOB_NAME_LABEL}={spec.name}"  # /scale's
    resized = Said(dict(elastic=sized.status, selector=selector), events=sized.events)
    return out.plan(verified, resized, suspend_job=toggle, scrape=scrape, resize_job=sized.job)


def _said(phase: str, reason: str, message: str, ready: bool, said: str, warning: bool = False) -> Said:
    """The phase, ``reason`` and ``message`` (an event when they change), and the ``Ready`` condition."""
    return Said(conditions=((reasons.READY, ready, reason, said),), phase=(phase, reason, message, warning))


def _finish(
    out: StatusBuilder, succeeded: bool, reason: str, message: str, delete: tuple[str, ...] = ()
) -> Plan:
    status.finish(out, succeeded, reason, message)
    return out.plan(delete_jobs=delete)
