"""Checkpoints, one room of the decision: what the status says of them. Pure.

- :func:`from_report`: what rank 0's report says the attempt restored (``status.checkpoint``: the step it
  resumed from, the checkpoint it warm-started from, the checkpoints it skipped as unreadable);
- :func:`durable`: the ``CheckpointsDurable`` condition, from the spec (object storage, a volume
  that outlives the pods, or a pod-local emptyDir);
- :func:`restored_events`: the events of an attempt that restored something other than its own newest
  checkpoint (a warm start, a skipped checkpoint).

:mod:`ddp_operator.decide.status` writes the first two into every branch's status
(:func:`~ddp_operator.decide.status.begin`); :mod:`ddp_operator.decide.decision` posts the events when an
attempt ends.
"""

from __future__ import annotations

from typing import Any

from ddp_operator.api import reasons, typed_status
from ddp_operator.api.spec import Spec, checkpoints_durable
from ddp_operator.api.typed_status import Checkpoint
from ddp_operator.decide.plan import Event
from ddp_operator.decide.status_builder import StatusBuilder
from ddp_trainer import contract


def from_report(report: contract.Report) -> dict[str, Any]:
    """The part of a report that becomes ``status.checkpoint``."""
    skipped = report.get("skippedCheckpoints")
    return typed_status.write(
        Checkpoint(
            report.get("resumedFromStep"),
            report.get("warmStartedFrom") or None,
            tuple(list(skipped)[:16]) if skipped else None,
        )
    )


def durable(spec: Spec) -> tuple[str, bool | None, str, str]:
    """``CheckpointsDurable``: whether a restart resumes from the checkpoints, and where they go."""
    s3 = spec.checkpoint.s3 if spec.checkpoint else None
    if s3 is not None:
        message = f"checkpoints go to object storage ({s3.url}): restarts resume"
        return reasons.CHECKPOINTS_DURABLE, True, "ObjectStorage", message
    if spec.checkpoint is not None and checkpoints_durable(spec):  # none given: a pod-local emptyDir
        return reasons.CHECKPOINTS_DURABLE, True, "Volume", "checkpoints outlive the pods: restarts resume"
    if spec.max_restarts > 0:
        message = (
            "checkpoints go to a pod-local emptyDir: restarts will start from step 0 "
            "(set spec.checkpoint.volumeClaimTemplate or spec.checkpoint.volume)"
        )
        return reasons.CHECKPOINTS_DURABLE, False, "EmptyDir", message
    return reasons.CHECKPOINTS_DURABLE, False, "EmptyDir", "checkpoints go to a pod-local emptyDir"


def restored_events(out: StatusBuilder, report: contract.Report | None) -> None:
    """Say what the attempt restored when it was not simply its own newest checkpoint (once per attempt)."""
    if report is None:
        return
    if report.get("warmStartedFrom"):
        source = report["warmStartedFrom"]
        message = f"warm start: the weights of {source} seeded this job (spec.checkpoint.warmStartFrom)"
        out.events.append(Event("Normal", "WarmStarted", message))
    for skipped in list(report.get("skippedCheckpoints") or [])[:4]:
        out.events.append(Event("Warning", "CheckpointSkipped", str(skipped)))
