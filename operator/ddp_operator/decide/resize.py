"""An elastic DDPJob resized in place (``spec.elastic``; ``kubectl scale ddpjob NAME --replicas=N`` edits
``spec.nodes`` through the ``/scale`` subresource). Pure.

The running attempt's Indexed Job keeps its name, its pods and its attempt number: its ``completions`` and
``parallelism`` change together to the new ``spec.nodes`` (Kubernetes >= 1.31, ElasticIndexedJob). Growing
adds pods at the next indexes, whose agents join the rendezvous: the running ranks stop at a step boundary,
checkpoint, and the bigger world resumes from it, verified. Shrinking removes the highest indexes; the
others re-rendezvous at the smaller world. No new Job, no new attempt, no restart of the DDPJob spent.
``status.elastic`` says the world now, the desired size, how many resizes and the last one."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ddp_operator.api import reasons
from ddp_operator.api.spec import Spec
from ddp_operator.decide.plan import Event
from ddp_operator.decide.status import parse_time, stamp
from ddp_operator.observe.facts import JobFacts


@dataclass(frozen=True)
class Resize:
    """What a reconcile does about an elastic job's size: the Job to resize (or None), the status'
    ``elastic``, and the event to post (or None)."""

    job: tuple[str, int] | None
    status: dict[str, Any]
    event: Event | None


def decide(
    spec: Spec, job: JobFacts, previous: Mapping[str, Any], ready: int, now: dt.datetime
) -> Resize | None:
    """For an elastic job whose current Job runs: resize the Job when its size is not ``spec.nodes``."""
    if spec.elastic is None:
        return None
    before = dict(previous.get("elastic") or {})
    status: dict[str, Any] = {
        "nodes": ready,
        "desired": spec.nodes,
        "minNodes": spec.elastic.min_nodes,
        "maxNodes": spec.elastic.max_nodes,
        "resizes": int(before.get("resizes", 0) or 0),
    }
    if "lastResize" in before:
        status["lastResize"] = before["lastResize"]
    if (since := below_min_since(spec, previous, ready, now)) is not None:
        status["belowMinSince"] = stamp(since)
    status["summary"] = f"{ready}/{spec.nodes} ({spec.elastic.min_nodes}-{spec.elastic.max_nodes})"
    size = job.parallelism
    if size is None or size == spec.nodes:
        return Resize(None, status, None)
    status["resizes"] += 1
    status["lastResize"] = {"from": size, "to": spec.nodes, "reason": reasons.SCALED, "time": stamp(now)}
    message = (
        f"Job {job.name} resized in place from {size} to {spec.nodes} nodes (spec.nodes changed: kubectl "
        "scale, or an edit); the running world re-rendezvous at a step boundary, verified before its first "
        "step; no new attempt, no restart spent"
    )
    return Resize((job.name, spec.nodes), status, Event("Normal", reasons.RESIZED, message))


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


def below_min_since(
    spec: Spec, previous: Mapping[str, Any], ready: int, now: dt.datetime
) -> dt.datetime | None:
    """Since when an elastic job that had trained (its world was at least ``minNodes``) has had fewer than
    ``minNodes`` nodes; None when it has enough, or has not yet trained (the start timeout covers that)."""
    if spec.elastic is None or ready >= spec.elastic.min_nodes:
        return None
    before = previous.get("elastic") or {}
    if (since := parse_time(before.get("belowMinSince"))) is not None:
        return since
    was = before.get("nodes")
    return now if isinstance(was, int) and was >= spec.elastic.min_nodes else None


def below_min(spec: Spec, previous: Mapping[str, Any], ready: int, now: dt.datetime) -> BelowMin | None:
    """:func:`below_min_since` as what the status says: how many nodes short and for how long."""
    since = below_min_since(spec, previous, ready, now)
    if since is None or spec.elastic is None:
        return None
    waited = (now - since).total_seconds()
    short = spec.elastic.min_nodes - ready
    return BelowMin(ready, short, waited, waited >= spec.elastic.below_min_timeout_seconds)
