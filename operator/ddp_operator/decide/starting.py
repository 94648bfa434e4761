"""Starting, one room of the decision: what a DDPJob says while its attempt's pods start, or cannot. Pure.

- :func:`refused_or_absent`: a start-up failure said before a pod could say it: pods that Pod Security
  admission refused, named from the rendered template (:mod:`ddp_operator.observe.refused_pods`), or a
  Secret or ConfigMap the spec names that is absent (:mod:`ddp_operator.observe.startup`);
- :func:`say_starting`: the phase and ``Ready`` of an attempt whose pods are not all running yet: the
  checkpoint claim that keeps them waiting (before the scheduler's message, which says only "pod has
  unbound immediate PersistentVolumeClaims"), a container that cannot start (:func:`cannot_start`),
  pods that cannot be scheduled, or simply starting.

:mod:`ddp_operator.decide.decision` asks it when the Job is created, and for a running attempt whose pods
are neither all ready, nor enough for an elastic job, nor below its minimum.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ddp_operator.api import reasons
from ddp_operator.api.spec import Spec
from ddp_operator.decide.plan import Event
from ddp_operator.decide.status_builder import StatusBuilder
from ddp_operator.observe import claims, refused_pods, startup
from ddp_operator.observe.facts import Facts
from ddp_operator.observe.references import Reference


def refused_or_absent(
    facts: Facts,
    spec: Spec,
    job: Mapping[str, Any],
    mount_events: Sequence[Mapping[str, Any]],
    missing: Collection[tuple[str, str]],
    refs: Sequence[Reference],
) -> Facts:
    """``facts`` with the start-up failure the pods could not say themselves (``facts.startup`` is None):
    pods refused by Pod Security admission, named from the rendered Job ``job`` and the Job controller's
    events (``mount_events``); else a Secret or ConfigMap the spec names (``refs``, as the caller found
    them) that the look-up found ``missing`` (said now, before a pod could say it)."""
    if facts.job is not None and mount_events:  # pods refused: named from the rendered template
        pod = job["spec"]["template"]["spec"]
        if refusal := refused_pods.failure(mount_events, facts.job.name, spec.namespace, pod):
            return dataclasses.replace(facts, startup=refusal)
    if missing and (absent := startup.absent(spec, missing, job["metadata"]["name"], refs)):
        return dataclasses.replace(facts, startup=absent)
    return facts


def say_starting(out: StatusBuilder, spec: Spec, facts: Facts, storage: claims.Diagnosis | None) -> None:
    """Pending while the attempt's pods start: why the checkpoint claim keeps them waiting, a container that
    cannot start, pods that cannot be scheduled, or starting."""
    ready, attempt = facts.ready_nodes, facts.attempt
    if (found := storage) is not None:
        # before the scheduler's message: it says only "pod has unbound immediate PersistentVolumeClaims"
        out.phase(reasons.PENDING, found.reason, found.message, warning=found.fault)
        out.condition(reasons.READY, False, found.reason, f"{ready}/{spec.nodes} pods ready; {found.message}")
    elif (failed := facts.startup) is not None:
        cannot_start(out, failed, ready, spec.nodes)
    elif why := facts.unschedulable:
        out.phase(reasons.PENDING, "Unschedulable", f"pods cannot be scheduled: {why}", warning=True)
        out.condition(reasons.READY, False, "Unschedulable", f"{ready}/{spec.nodes} pods ready; {why}")
    else:
        out.phase(reasons.PENDING, "Starting", f"starting {spec.nodes} pods of attempt {attempt}")
        out.condition(reasons.READY, False, "Starting", f"{ready}/{spec.nodes} pods ready")


def cannot_start(out: StatusBuilder, failed: startup.StartupFailure, ready: int, nodes: int) -> None:
    """A container the kubelet cannot start (an image, a Secret): Pending, the kubelet's words and the fix
    in ``Ready``, a Warning event once per cause (not at each retry of the kubelet's, which alternates
    ``ErrImagePull`` and ``ImagePullBackOff``). No restart: a new gang would wait for the same cause, and
    the pods start by themselves once it is gone (the start timeout counts only from when all run)."""
    old = out.said(reasons.READY)
    said = (
        out.last.phase == reasons.PENDING
        and startup.same_cause(str(old.reason if old is not None else None), failed.reason)
        and failed.subject in str(old.message if old is not None else None)
    )
    out.set(phase=reasons.PENDING)
    if not said:
        out.events.append(Event("Warning", failed.reason, failed.said))
    out.condition(reasons.READY, False, failed.reason, f"{ready}/{nodes} pods ready; {failed.said}")
