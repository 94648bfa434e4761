"""One reconcile's reading of a DDPJob: the :class:`Observation` the decision is one pure function of
(:func:`ddp_operator.decide.decision.decide`). :mod:`ddp_operator.runtime.reconcile` builds it once per
reconcile, from Kopf's indexes, what :mod:`ddp_operator.runtime.reads` read and the scraper's latest
reading, with the spec parsed once (``parse(body, admitted=True)``, or the ``SpecError`` that says why it
cannot be read). A value: nothing here reads the cluster.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddp_operator.api.spec import Spec, SpecError
from ddp_operator.observe import claims, live


@dataclass(frozen=True)
class Observation:
    """Everything the decision reads about one DDPJob, read once per reconcile."""

    body: Mapping[str, Any]
    """The DDPJob, with what this operator wrote since the watches last showed it."""
    spec: Spec | SpecError
    """``body``'s spec, parsed once, or why it cannot be read (a hand-edited object, an older CRD): the
    decision then fails the DDPJob with reason ``InvalidSpec``."""
    jobs: list[dict[str, Any]]
    """The Jobs that carry the DDPJob's label."""
    pods: list[dict[str, Any]]
    """The pods that carry the DDPJob's label."""
    now: dt.datetime
    snapshot: live.Snapshot | None = None
    """The latest reading of the pods' metrics (:mod:`ddp_operator.runtime.scraper`), if any."""
    claim: claims.ClaimReading | None = None
    """What the cluster says about the checkpoint claim, when :func:`claims.claim_to_read` asked for it."""
    workloads: Mapping[str, Mapping[str, Any]] | None = None
    """Kueue's Workloads of the DDPJob's Jobs, by Job name (:mod:`~ddp_operator.observe.workloads`)."""
    mount_events: Sequence[Mapping[str, Any]] = ()
    """The events read for the DDPJob: the kubelet's ``FailedMount`` on its pods
    (:func:`~ddp_operator.observe.mounts.pods_to_read`), the Job controller's ``FailedCreate`` on a Job
    without pods (:func:`~ddp_operator.observe.refused_pods.jobs_to_read`)."""
    missing: Collection[tuple[str, str]] = ()
    """The (kind, name) of the Secrets and ConfigMaps the spec names that the operator looked up and found
    absent (:func:`~ddp_operator.observe.references.to_look_up`)."""
    unhealthy: Mapping[str, str] | None = None
    """The nodes whose GPUs are marked unhealthy (:mod:`~ddp_operator.observe.nodehealth`), which a new
    attempt's pods avoid along with the job's own ``status.probe.faultyNodes``."""
    store_pods: Sequence[Mapping[str, Any]] = ()
    """The pods of an elastic job's rendezvous store Jobs (:mod:`~ddp_operator.observe.store_health`)."""
