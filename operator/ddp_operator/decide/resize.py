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
from ddp_operator.decide.status import stamp
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
