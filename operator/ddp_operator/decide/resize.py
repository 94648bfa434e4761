"""An elastic DDPJob resized in place (``spec.elastic``; ``kubectl scale ddpjob NAME --replicas=N`` edits
``spec.nodes`` through the ``/scale`` subresource). Pure.

The running attempt's Indexed Job keeps its name, its pods and its attempt number: its ``completions`` and
``parallelism`` change together to the new ``spec.nodes`` (Kubernetes >= 1.31, ElasticIndexedJob). Growing
adds pods at the next indexes, whose agents join the rendezvous: the running ranks stop at a step boundary,
checkpoint, and the bigger world resumes from it, verified. Shrinking removes the highest indexes; the
others re-rendezvous at the smaller world. No new Job, no new attempt, no restart of the DDPJob spent.
``status.elastic`` says the world that trains now (the trainer's word: rank 0's ``ddp_info``, until it says
it the pods ready), the desired size, how many resizes and the last one: every change of that world counts,
whatever caused it, with its reason (``contract.RESIZE_REASONS``: a scale the operator made, or the
launchers' record of a node lost, gone silent or rejoined)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from typing import Any

from ddp_operator.api import reasons, typed_status
from ddp_operator.api.spec import Spec
from ddp_operator.api.typed_status import Counted, Elastic, Status
from ddp_operator.decide.plan import Event
from ddp_operator.decide.status_builder import Parts, Section, StatusBuilder, parse_time, stamp
from ddp_operator.observe.facts import JobFacts
from ddp_operator.observe.live import Snapshot
from ddp_operator.observe.metrics import LastResize, Progress

TRAINER, PODS_READY = "Trainer", "PodsReady"
"""``status.elastic.nodesFrom``: whose word ``nodes`` is: the trainer's (its world, read from its metrics),
or, until a rank says it, the pods ready."""


@dataclass(frozen=True)
class Resize:
    """What a reconcile does about an elastic job's size: the Job to resize (or None), the status'
    ``elastic``, and the events to post."""

    job: tuple[str, int] | None
    status: Parts
    """``status.elastic`` said as its parts, going on from the section begun (the builder writes it)."""
    events: tuple[Event, ...] = ()


def world(spec: Spec, reading: Progress | None) -> int | None:
    """The nodes of the world that trains now, as the trainer says it (its processes over
    ``procsPerNode``); None where no rank says it."""
    if reading is None or not reading.world_size:
        return None
    return max(1, reading.world_size // spec.procs_per_node)


def decide(
    spec: Spec,
    job: JobFacts,
    out: StatusBuilder,
    ready: int,
    now: dt.datetime,
    reading: Progress | None = None,
    held: bool = False,
) -> Resize | None:
    """For an elastic job whose current Job runs: ``status.elastic`` (the world the trainer says trains
    now, else the pods ready), every change of that world counted with its reason, and the Job resized
    when its size is not ``spec.nodes``. ``reading``: this attempt's latest metrics reading; ``held``: a
    reading of this attempt exists, so a moment without one (the pods' metrics servers restart with a new
    world) keeps the trainer's last word rather than falling back to the pods. ``out``: the status being
    built, whose previous ``elastic`` this one goes on from."""
    if spec.elastic is None:
        return None
    before = out.last.elastic or Elastic()
    trained = world(spec, reading)
    was = before.nodes if before.nodes_from == TRAINER else None
    if trained is not None:
        nodes, source = trained, TRAINER
    elif held and isinstance(was, int):
        nodes, source = was, TRAINER
    else:
        nodes, source = ready, PODS_READY
    # begun in one call; what follows is said in ``later``'s parts, written at once in their order
    first = dict(
        nodes=nodes,
        nodes_from=source,
        desired=spec.nodes,
        min_nodes=spec.elastic.min_nodes,
        max_nodes=spec.elastic.max_nodes,
        resizes=before.resizes or 0,
    )
    status = Section(Elastic, out.section("elastic", Elastic, first, keep=("last_resize",)))  # kept as stored
    written = Written(before.resizes or 0, before.last_resize or typed_status.LastResize())
    later: list[dict[str, Any]] = []
    if (since := below_min_since(spec, out.last, ready, now)) is not None:
        later.append(dict(below_min_since=since))
    summary = f"{nodes}/{spec.nodes} ({spec.elastic.min_nodes}-{spec.elastic.max_nodes})"
    later.append(dict(summary=summary))
    events: list[Event] = []
    counted = _counted(before, job.name)
    if counted is not None:
        later.append(dict(counted=counted))
    if reading is not None and reading.changes:
        events.extend(_count_changes(status, later, written, counted, job.name, reading))
    size = job.parallelism
    if size is None or size == spec.nodes:
        return Resize(None, Parts(Elastic, tuple(later), stored=status.values), tuple(events))
    record = typed_status.LastResize(size, spec.nodes, reasons.SCALED, out.now)
    later.append(dict(resizes=written.resizes + 1, last_resize=record))
    message = (
        f"Job {job.name} resized in place from {size} to {spec.nodes} nodes (spec.nodes changed: kubectl "
        "scale, or an edit); the running world re-rendezvous at a step boundary, verified before its first "
        "step; no new attempt, no restart spent"
    )
    events.append(Event("Normal", reasons.RESIZED, message))
    return Resize((job.name, spec.nodes), Parts(Elastic, tuple(later), stored=status.values), tuple(events))


@dataclass
class Written:
    """What ``status.elastic`` says so far of the resizes: how many, and the last (typed)."""

    resizes: int
    last_resize: typed_status.LastResize


def _counted(before: Elastic, job: str) -> Counted | None:
    """The watermark kept in the status (``status.elastic.counted``: the Job, or attempt, and the highest
    rendezvous round whose world change is counted, so each change counts once, whichever reading first
    shows it), for this Job only (a new attempt's rounds start again)."""
    counted = before.counted
    if counted is not None and counted.job == job and counted.round is not None:
        return Counted(job, counted.round)
    return None


def _count_changes(
    status: Section,
    later: list[dict[str, Any]],
    written: Written,
    mark: Counted | None,
    job: str,
    reading: Progress,
) -> list[Event]:
    """Every world change the launchers recorded in a round past the watermark ``mark``, oldest first: each
    once, though the operator may have read none of the worlds between (a world that lived between two
    readings, a reading that failed while a node was lost). What it says goes in ``later`` (and
    ``written``), but a scale's cost, written into its record as stored (``status``)."""
    counted = mark.round if mark is not None and mark.round is not None else -1
    events: list[Event] = []
    for change in reading.changes:
        if change.round <= counted:
            continue
        last = reading.last_resize
        if last is not None and last.round == change.round:  # the cost is said for the last change only
            change = dataclasses.replace(
                change, seconds_lost=last.seconds_lost, steps_lost=last.steps_lost, bytes_sent=last.bytes_sent
            )
        events.extend(_world_changed(status, later, written, change))
        counted = change.round
    if counted >= 0:
        later.append(dict(counted=Counted(job, counted)))
    return events


def _world_changed(
    status: Section, later: list[dict[str, Any]], written: Written, change: LastResize
) -> list[Event]:
    """The trainer's world went from ``change.before`` to ``change.after`` nodes. A step of a scale the
    operator made (toward its size) is that scale, counted when the Job was resized: its cost is written
    when the world reaches it. Any other change is a resize of its own, with the launcher's reason:
    counted, said."""
    was, now = change.before, change.after
    last = written.last_resize
    if last.reason == reasons.SCALED and last.seconds_lost is None and _toward(last, was, now):
        if now == last.to_nodes and change.seconds_lost is not None:
            cost = round(change.seconds_lost, 1)
            # the scale's record as stored (kept), its keys in their order, with what it cost
            status.with_field("last_resize", typed_status.LastResize, "seconds_lost", cost)
            status.with_field("last_resize", typed_status.LastResize, "mode", change.mode)
            written.last_resize = dataclasses.replace(last, seconds_lost=cost, mode=change.mode)
        return []
    if change.reason not in reasons.RESIZE_REASONS:
        return []  # not a reason of ddpjob's launcher: not guessed
    record = typed_status.LastResize(
        change.before,
        change.after,
        change.reason,
        stamp(dt.datetime.fromtimestamp(change.at, dt.UTC)),
        round(change.seconds_lost, 1) if change.seconds_lost is not None else None,
        change.mode,
        change.steps_lost,
        change.bytes_sent,
    )
    written.resizes, written.last_resize = written.resizes + 1, record
    later.append(dict(resizes=written.resizes, last_resize=record))
    lost = (
        f", {change.seconds_lost:.1f} s from the stop to the new world verified"
        if change.seconds_lost
        else ""
    )
    how = (
        "healed in place: the survivors kept their processes and state"
        if change.mode == reasons.HEALED
        else "its workers restarted from the last checkpoint"
    )
    if change.mode == reasons.HEALED and change.steps_lost is not None and change.bytes_sent is not None:
        how += f" ({change.steps_lost} step(s) lost, {change.bytes_sent} bytes of state sent)"
    message = (
        f"the world that trains went from {change.before} to {change.after} nodes ({change.reason}: "
        f"{WHY[change.reason]}), {how}{lost}; no new attempt, no restart spent"
    )
    kind = "Normal" if change.reason == reasons.NODE_REJOINED else "Warning"
    return [Event(kind, reasons.RESIZED, message)]


WHY = {
    reasons.NODE_LOST: "a node's processes ended, or it left",
    reasons.NODE_SILENT: "a node went silent and was dropped past the keep-alive bound",
    reasons.NODE_REJOINED: "a node joined at a step boundary",
    reasons.SCALED: "spec.nodes changed",
}
"""Each reason of ``contract.RESIZE_REASONS`` in words, for the ``Resized`` event."""


def _toward(scale: typed_status.LastResize, was: int, now: int) -> bool:
    """Whether a world change from ``was`` to ``now`` is a step of the scale from ``scale.from_nodes`` to
    ``scale.to_nodes``: in its direction, and not past its size."""
    start, end = scale.from_nodes, scale.to_nodes
    if start is None or end is None or start == end:
        return False
    if end > start:
        return was < now <= end
    return end <= now < was


@dataclass(frozen=True)
class BelowMin:
    """An elastic job that trained and has fewer than ``minNodes`` nodes now: how short, since when, and
    whether it has waited past ``belowMinTimeoutSeconds``."""

    ready: int
    short: int
    waited: float
    over: bool

    def message(self, spec: Spec, unschedulable: str | None = None) -> str:
        assert spec.elastic is not None
        bound = spec.elastic.below_min_timeout_seconds
        plural = "s" if self.short > 1 else ""
        why = f"; the missing pods: {unschedulable}" if unschedulable else ""
        if self.over:
            return (
                f"only {self.ready} of minNodes {spec.elastic.min_nodes} nodes for {self.waited:.0f} s, "
                f"past spec.elastic.belowMinTimeoutSeconds ({bound} s): short by {self.short} node{plural}"
                f"{why}; not restarting (a new gang would wait for the same nodes)"
            )
        return (
            f"waiting for {self.short} more node{plural}: {self.ready} of minNodes {spec.elastic.min_nodes} "
            f"running (desired {spec.nodes}) for {self.waited:.0f} s; the job fails after "
            f"spec.elastic.belowMinTimeoutSeconds ({bound} s){why}"
        )


def below_min_since(spec: Spec, previous: Status, ready: int, now: dt.datetime) -> dt.datetime | None:
    """Since when an elastic job that had trained (its world was at least ``minNodes``) has had fewer than
    ``minNodes`` nodes; None when it has enough, or has not yet trained (the start timeout covers that)."""
    if spec.elastic is None or ready >= spec.elastic.min_nodes:
        return None
    before = previous.elastic or Elastic()
    if (since := parse_time(before.below_min_since)) is not None:
        return since
    was = before.nodes
    return now if was is not None and was >= spec.elastic.min_nodes else None


def below_min(spec: Spec, previous: Status, ready: int, now: dt.datetime) -> BelowMin | None:
    """:func:`below_min_since` as what the status says: how many nodes short and for how long."""
    since = below_min_since(spec, previous, ready, now)
    if since is None or spec.elastic is None:
        return None
    waited = (now - since).total_seconds()
    short = spec.elastic.min_nodes - ready
    return BelowMin(ready, short, waited, waited >= spec.elastic.below_min_timeout_seconds)


def of_reading(
    spec: Spec,
    job: JobFacts,
    out: StatusBuilder,
    ready: int,
    now: dt.datetime,
    snapshot: Snapshot | None,
    attempt: int,
) -> Resize | None:
    """:func:`decide` with the metrics reading of ``attempt``, if the snapshot holds one: the world the
    trainer says trains."""
    held = snapshot is not None and snapshot.attempt == attempt
    reading = snapshot.latest if snapshot is not None and held else None
    return decide(spec, job, out, ready, now, reading, held)
