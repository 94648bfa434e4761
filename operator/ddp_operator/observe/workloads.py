"""Kueue's Workloads, read: which of a Job's Workloads is current, what the index keeps of one, and a
Workload read into what the decision needs (:class:`Workload`). Pure.

With ``spec.queueName`` the operator creates the attempt's Job suspended, labelled
``kueue.x-k8s.io/queue-name``; Kueue makes a Workload for it (owned by the Job), reserves quota in the
LocalQueue's ClusterQueue when the whole gang fits, and admits it by unsuspending the Job; it may evict the
Workload later and requeue it. Its conditions carry Kueue's own words (``QuotaReserved`` False with
"insufficient unused quota for cpu ..."; ``Evicted`` with "Preempted to accommodate a workload ...").
What the DDPJob says of them is :mod:`ddp_operator.decide.kueue`'s.

An elastic DDPJob's Job carries ``kueue.x-k8s.io/elastic-job: "true"``: with Kueue's
``ElasticJobsViaWorkloadSlices`` a scale-up of the running Job is a new Workload *slice* (annotated
``kueue.x-k8s.io/workload-slice-replacement-for`` the one it replaces) whose new pods wait behind Kueue's
scheduling gate until the slice is admitted, while the running pods train on; the replaced slice finishes
then. :func:`current` picks the slice that matters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

GROUP: Final = "kueue.x-k8s.io"
WORKLOADS: Final = "workloads"
SLICE_REPLACES: Final = "kueue.x-k8s.io/workload-slice-replacement-for"
"""The annotation of a Workload slice made by a scale-up: the slice it replaces once admitted."""


@dataclass(frozen=True)
class Workload:
    """What the decision reads of a Job's Workload."""

    name: str
    admitted: bool
    cluster_queue: str | None
    """Where quota is reserved, while it is."""
    pending: str
    """``QuotaReserved``'s message while no quota is reserved (why it waits), else ''."""
    inadmissible: bool
    """``QuotaReserved`` is False with reason ``Inadmissible``: it cannot be admitted as things are."""
    evicted: tuple[str, str] | None
    """``Evicted`` (reason, message) while it is True: Kueue took the admission back."""
    evictions: int
    """How many times Kueue evicted it, every reason (``status.schedulingStats``)."""


def _conditions(body: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {c.get("type", ""): c for c in (body.get("status") or {}).get("conditions") or []}


def owner_job(body: Mapping[str, Any]) -> str | None:
    """The name of the batch Job that owns a Workload, if one does."""
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == "Job" and str(ref.get("apiVersion", "")).startswith("batch/"):
            return str(ref.get("name"))
    return None


def slim(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Workload as the operator's index keeps it: what :func:`read` reads, not its pod sets."""
    status = body.get("status") or {}
    kept = {key: status[key] for key in ("conditions", "schedulingStats") if key in status}
    if cluster_queue := (status.get("admission") or {}).get("clusterQueue"):
        kept["admission"] = {"clusterQueue": cluster_queue}
    meta = body.get("metadata", {})
    slim_meta: dict[str, Any] = {k: meta[k] for k in ("name", "ownerReferences") if k in meta}
    if replaces := (meta.get("annotations") or {}).get(SLICE_REPLACES):
        slim_meta["annotations"] = {SLICE_REPLACES: replaces}
    return {"metadata": slim_meta, "status": kept}


def current(bodies: list[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """Of the Workloads one Job owns (one, or an elastic Job's slices), the one the DDPJob speaks of: a
    slice that replaces another and is not finished (a scale-up waiting for, or just given, quota), else
    one not finished, else the first."""
    unfinished = [b for b in bodies if _conditions(b).get("Finished", {}).get("status") != "True"]
    for body in unfinished:
        if (body.get("metadata", {}).get("annotations") or {}).get(SLICE_REPLACES):
            return body
    found = unfinished or bodies
    return found[0] if found else None


def read(body: Mapping[str, Any]) -> Workload:
    conditions = _conditions(body)
    status = body.get("status") or {}
    reserved = conditions.get("QuotaReserved", {})
    evicted = conditions.get("Evicted", {})
    stats = (status.get("schedulingStats") or {}).get("evictions") or []
    return Workload(
        name=str(body.get("metadata", {}).get("name", "")),
        admitted=conditions.get("Admitted", {}).get("status") == "True",
        cluster_queue=(status.get("admission") or {}).get("clusterQueue"),
        pending=str(reserved.get("message") or "") if reserved.get("status") != "True" else "",
        inadmissible=reserved.get("status") == "False" and reserved.get("reason") == "Inadmissible",
        evicted=(str(evicted.get("reason") or ""), str(evicted.get("message") or ""))
        if evicted.get("status") == "True"
        else None,
        evictions=sum(int(entry.get("count") or 0) for entry in stats),
    )
