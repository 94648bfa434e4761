"""When an elastic attempt has finished training: rank 0's report says so, never the pods' exit codes. Pure.

An elastic DDPJob trains at any size from ``minNodes`` up, so a pod of its Indexed Job may never run: a
scale-up pod Pending for want of capacity, or gated by Kueue until a Workload slice that is never admitted.
The Job is Complete only when every index has succeeded, so such a pod would hold back a job whose training
finished (and, its world gone below ``minNodes``, fail it after ``belowMinTimeoutSeconds``). So the attempt
has ended, Succeeded, once the pod at index 0 (node rank 0) has succeeded, its report says the training
reached its last step with the replicas verified, and every other pod of the attempt has either stopped or
never started (still Pending). The operator then shrinks the Job to index 0 (an Indexed Job's scale-down,
as ``kubectl scale`` does: the Pending pods are deleted, and the Job completes on its index 0), so no pod is
left behind; the pods that ran keep their logs. A pod still running :data:`FINISH_WAIT_SECONDS` after rank 0
finished is not waited for either: the peers of the last world end within seconds of rank 0, so it is one
that left the world (a node gone silent: frozen, powered off, cut off from the network, whose survivors
trained on without it). Its end, whenever it comes, is not the attempt's: the shrink ends it too.

Pod 0 itself may be the one that left the world (or its replacement that never started): the survivors'
new world had its rank 0 in another pod, whose report says the same (every pod's local rank 0 writes the
world's verdict; ``observe.facts.finisher`` picks it). Then the Job is shrunk to no index at all
(``completions: 0``), which deletes every pod still active and completes the Job, the finished pods kept.

Not the Job's ``successPolicy`` (``succeededIndexes: "0"``, GA in Kubernetes 1.33), which would do the same
in the Job controller: it deletes every pod it still counts active once index 0 succeeds, and a peer that
finished in the same second, whose kubelet had not said so yet, is one of them: its log goes with it.

The end is decided by rank 0's report (:func:`verdict`), not by exit codes: a Job complete while
the report does not say the last step was reached (``bench/RESULTS.md`` records a "late joiner" that exited
0 and made a job Succeeded at step 70 of 400) ends the attempt, and the policy restarts it from its checkpoint
(reason :data:`ENDED_EARLY`), or fails the job when it trained to the end with its replicas not verified
(:data:`NOT_VERIFIED`). A rigid job is not decided here: its Job completes when every pod has.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddp_operator.api import reasons
from ddp_operator.api.spec import Spec, known_total_steps, sync_hook
from ddp_operator.observe.facts import JobFacts
from ddp_trainer import contract

ENDED_EARLY = reasons.ENDED_EARLY
NOT_VERIFIED = reasons.NOT_VERIFIED
FINISH_WAIT_SECONDS = 10.0
"""How long pods still running are waited for once rank 0 finished verified: the last world's peers end
within seconds of rank 0 (they reached the same last step; their launchers pass the same exit barrier), a
pod that left the world (silent, frozen) never does. ``ddpjob local`` waits as long."""
NOTHING_TO_VERIFY = (*contract.NOTHING_TO_COMPARE, contract.SYNC_HOOK_OFF)
"""Report reasons that say there was nothing the sync check could compare (``SyncVerified`` Unknown): the
report's own verdict, not a divergence."""


@dataclass(frozen=True)
class Verdict:
    """What rank 0's report says of the attempt's training: finished (``done``), or why not."""

    done: bool
    reason: str = ""
    """:data:`ENDED_EARLY` or :data:`NOT_VERIFIED` when not done."""
    message: str = ""


@dataclass(frozen=True)
class End:
    """An elastic attempt that has ended: the report's :class:`Verdict`, and the Job to shrink to its index 0
    (``(name, 1)``), or to no index (``(name, 0)``, when pod 0 is one of them), to end the pods that never
    started or left the world (``left`` of them)."""

    verdict: Verdict
    shrink: tuple[str, int] | None = None
    left: int = 0
    running: int = 0
    """Of ``left``, the pods still running :data:`FINISH_WAIT_SECONDS` after rank 0 finished (left the world:
    silent, frozen); the others never started."""


def writes_report(spec: Spec) -> bool:
    """Whether rank 0 writes a report: the built-in trainer does, and so does the sync hook for a command of
    the user's (``spec.syncCheck.autoInstrument``). A command of the user's without the hook writes none."""
    return (spec.command is None and spec.args is None) or sync_hook(spec)


def verdict(
    report: Mapping[str, Any] | None, total_steps: int, expected: bool = True, warn: bool = False
) -> Verdict:
    """Whether rank 0's ``report`` says the training finished: result ``Succeeded`` (the trainer says
    ``Interrupted`` for a run stopped short of its steps), at its last step (``total_steps``, where the spec
    knows it: the built-in trainer's ``trainer.steps``), and the replicas verified (or nothing to compare,
    which the report says by its reason). ``expected``: whether a report is to be had at all
    (:func:`writes_report`); without one, and none expected, the Job's completion is all there is."""
    if report is None:
        if not expected:
            return Verdict(True)
        return Verdict(False, ENDED_EARLY, "rank 0 wrote no report: nothing says the training finished")
    result, step, said = report.get("result"), report.get("step"), report.get("message")
    detail = f" ({report.get('reason')}: {said})" if said else ""
    of = f" of {total_steps}" if total_steps else ""
    if result != contract.SUCCEEDED:
        return Verdict(False, ENDED_EARLY, f"rank 0's report says {result} at step {step}{of}{detail}")
    if total_steps and not (isinstance(step, int) and step >= total_steps):
        return Verdict(False, ENDED_EARLY, f"rank 0's report says step {step}{of}{detail}")
    if report.get("verified") is True or report.get("reason") in NOTHING_TO_VERIFY or warn:
        return Verdict(True)  # warn: spec.syncCheck.onDivergence Warn asked to train on, as a rigid job does
    return Verdict(
        False,
        NOT_VERIFIED,
        f"rank 0's report says the training reached step {step}{of} with its replicas not verified{detail}",
    )


def elastic_end(
    job: JobFacts,
    report: Mapping[str, Any] | None,
    total_steps: int,
    expected: bool,
    warn: bool = False,
    now: dt.datetime | None = None,
) -> End | None:
    """An elastic attempt's end, or None while it has not ended (or it failed: the policy decides that).

    The Job complete: the report decides (:func:`verdict`). Before that, the pod at index 0 succeeded and its
    report says the training finished, verified: ended, and the Job is shrunk to index 0, once the only pods
    of the attempt not stopped never started, or have run on :data:`FINISH_WAIT_SECONDS` since rank 0
    finished (``now``). Pods still running before that (the last world's peers finishing, a late joiner
    about to find the rendezvous closed) are waited for: they end by themselves within seconds."""
    if not may_have_ended(job):
        return None
    if job.complete:
        return End(verdict(report, total_steps, expected, warn))
    running = job.stopping_pods - job.never_started
    if running and not waited_out(job.finished_at, now):
        return None
    found = verdict(report, total_steps, warn=warn)  # ahead of the Job: only on rank 0's own word
    keep = 1 if job.finished_index == 0 else 0  # pod 0 left the world: no index of the Job is kept
    return End(found, (job.name, keep), job.stopping_pods, running) if found.done else None


def may_have_ended(job: JobFacts) -> bool:
    """Whether an elastic attempt's Job may have ended, for its report to judge: complete, or the pod at
    index 0 finished while others stop (a failed Job is the policy's)."""
    return not job.failed and (job.complete or (job.finished_index is not None and bool(job.stopping_pods)))


def waited_out(finished_at: dt.datetime | None, now: dt.datetime | None) -> bool:
    """Whether :data:`FINISH_WAIT_SECONDS` have passed since rank 0 finished (``finished_at``)."""
    if finished_at is None or now is None:
        return False
    return (now - finished_at).total_seconds() >= FINISH_WAIT_SECONDS


def ended_message(end: End) -> str:
    """What the Succeeded message adds when pods of the attempt never started, or ran on after rank 0
    finished (they left the world)."""
    said = []
    if never := end.left - end.running:
        said.append(f"{never} pod(s) never started (no capacity, or gated by Kueue)")
    if end.running:
        said.append(
            f"{end.running} pod(s) still ran {FINISH_WAIT_SECONDS:.0f} s after rank 0 finished (they had "
            "left the world: silent, frozen or cut off)"
        )
    to = "index 0" if end.shrink is None or end.shrink[1] else "no index (pod 0 was one of them)"
    return f"; {' and '.join(said)}: ended by shrinking the Job to {to}" if said else ""


def finished_pod(
    codes: Sequence[int | None],
    reports: Sequence[Mapping[str, Any] | None],
    total_steps: int,
    warn: bool = False,
) -> int | None:
    """``ddpjob local``'s reading of an elastic attempt's end: the index of a pod that exited 0 with a report
    saying the training finished, verified (:func:`verdict`; pod 0's first), or None. Only a report decides:
    a command of the user's that writes none ends when every pod has."""
    for index, (code, report) in enumerate(zip(codes, reports, strict=True)):
        if code == 0 and report is not None and verdict(report, total_steps, warn=warn).done:
            return index
    return None


def attempt_end(
    spec: Spec, job: JobFacts | None, report: Mapping[str, Any] | None, now: dt.datetime | None = None
) -> End | None:
    """An elastic attempt's end (:func:`elastic_end`): its Job complete, or rank 0 finished verified while
    pods that never started, or that left the world (silent), keep the Job from completing; None for a
    rigid job, or before the Job."""
    if spec.elastic is None or job is None or not may_have_ended(job):
        return None  # the spec's total steps are read only where a report may judge the end
    expected = writes_report(spec)
    warn = spec.sync_check.on_divergence == "Warn"
    return elastic_end(job, report, known_total_steps(spec), expected, warn, now)
