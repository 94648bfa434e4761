"""What exists → plain facts: a DDPJob's batch Jobs and pods, read as the decision needs them. Pure.

The handlers hand over the objects Kopf's indexes hold (dicts shaped like the API server's); nothing here
calls the API or decides what to do: :mod:`ddp_operator.decide.decision` decides from the :class:`Facts`.

Long because the ways an attempt ends are read here together, each with what Kubernetes does and does
not say about it: the Job's conditions, rank 0's report, a preemption told from a crash, and a lost node
(whose pods the API server keeps Terminating and the Job controller never counts as failed).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ddp_operator.api import exits, names, reasons
from ddp_operator.observe import failures, mounts, podlogs
from ddp_operator.observe.live import Target
from ddp_operator.observe.outcome import Outcome
from ddp_operator.observe.references import Reference
from ddp_operator.observe.startup import StartupFailure, first_failure
from ddp_trainer import contract


@dataclass(frozen=True)
class JobFacts:
    """The current attempt's batch Job."""

    name: str
    complete: bool
    failed: bool
    suspended: bool
    outcome: Outcome | None
    """How the attempt ended, when it failed (exit codes, rank 0's report, the Job's reason)."""
    failed_at: dt.datetime | None = None
    """When the Job's Failed condition became true."""
    parallelism: int | None = None
    """The Job's ``spec.parallelism``: an elastic job's size now (``decide.resize``)."""
    stopping_pods: int = 0
    """Pods of the attempt that have not terminated yet (the Job controller stops them after a failure;
    rank 0 writes its report, and its SIGTERM checkpoint, on the way out), except pods evicted from a
    node that does not answer: the decision does not wait for them."""
    finished_index: int | None = None
    """The completion index of the pod that succeeded with the attempt's report (:func:`finisher`)."""
    finished_at: dt.datetime | None = None
    """When that pod's trainer container ended (its terminated state's ``finishedAt``)."""
    never_started: int = 0
    """Pods of the attempt still Pending (unscheduled, Kueue-gated, not started); in :attr:`stopping_pods`."""


@dataclass(frozen=True)
class Facts:
    """Everything the decision needs to know about a DDPJob's children."""

    attempt: int
    """The newest attempt: the status' or the highest attempt label among the Jobs."""
    job: JobFacts | None
    """The Job of ``attempt``, if it exists."""
    stale_jobs: tuple[str, ...]
    """Jobs of earlier attempts (still going away)."""
    ready_nodes: int
    """Pods of ``attempt`` that are Running and Ready."""
    unschedulable: str | None
    """The scheduler's message when a pod of ``attempt`` cannot be scheduled."""
    report: contract.Report | None
    """Rank 0's termination report in ``attempt``, once it wrote one."""
    targets: tuple[Target, ...] = ()
    """The running pods of ``attempt`` and where each serves its metrics."""
    stale_deadlines: tuple[tuple[str, dt.datetime], ...] = ()
    """Stale Jobs whose pods all go too, and when to stop waiting for those pods (:func:`stale_deadlines`)."""
    startup: StartupFailure | None = None
    """The first container of ``attempt`` the kubelet cannot start (an image, a Secret), in its words."""


def attempt_of(obj: Mapping[str, Any]) -> int:
    """The attempt label of a Job or pod (0 when missing or malformed: never the current attempt)."""
    try:
        return int(obj.get("metadata", {}).get("labels", {}).get(names.ATTEMPT_LABEL, "0"))
    except ValueError:
        return 0


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The condition ``kind`` of ``obj`` when its status is True."""
    for found in obj.get("status", {}).get("conditions", []) or []:
        if found.get("type") == kind and found.get("status") == "True":
            result: Mapping[str, Any] = found
            return result
    return None


def failure(job: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The Job's ``Failed`` condition, or ``FailureTarget``: the Job controller has decided that the Job
    fails and adds ``Failed`` only once every pod has terminated, which a pod on a lost node never does."""
    return condition(job, "Failed") or condition(job, "FailureTarget")


def completion_index(pod: Mapping[str, Any]) -> int:
    try:
        return int(pod["metadata"].get("annotations", {}).get(names.COMPLETION_INDEX_ANNOTATION, "-1"))
    except ValueError:
        return -1


def terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The trainer container's terminated state (or its last one)."""
    for status in pod.get("status", {}).get("containerStatuses", []) or []:
        if status.get("name") == names.CONTAINER_NAME:
            state = status.get("state", {}).get("terminated") or status.get("lastState", {}).get("terminated")
            return state if isinstance(state, dict) else None
    return None


def evicted_from_lost_node(pod: Mapping[str, Any]) -> bool:
    """Deleted by the taint-eviction controller (``DisruptionTarget``, ``DeletionByTaintManager``): its
    node carries a NoExecute taint, usually because it stopped answering; its kubelet may never report."""
    found = condition(pod, "DisruptionTarget")
    return found is not None and found.get("reason") == "DeletionByTaintManager"


def stopped(pod: Mapping[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed") or terminated(pod) is not None


def _time(text: Any) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(str(text).replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


def ready(pod: Mapping[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") == "Running" and condition(pod, "Ready") is not None


def unschedulable(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """The scheduler's message for the first pod it cannot place."""
    for pod in pods:
        for found in pod.get("status", {}).get("conditions", []) or []:
            if (found.get("type"), found.get("status"), found.get("reason")) == (
                "PodScheduled",
                "False",
                "Unschedulable",
            ):
                return str(found.get("message") or "no node can run this pod")
    return None


def metrics_targets(pods: Sequence[Mapping[str, Any]], attempt: int, port: int) -> tuple[Target, ...]:
    """The running pods of ``attempt`` that have an IP: where their trainer serves ``/metrics``."""
    found = []
    for pod in pods:
        ip = pod.get("status", {}).get("podIP")
        if attempt_of(pod) == attempt and ip and pod.get("status", {}).get("phase") == "Running":
            host = f"[{ip}]" if ":" in ip else ip
            found.append(
                Target(pod["metadata"]["name"], completion_index(pod), f"http://{host}:{port}/metrics")
            )
    return tuple(sorted(found, key=lambda target: target.index))


def rank0_report(pods: Sequence[Mapping[str, Any]]) -> contract.Report | None:
    """The trainer's report from the termination message of the pod at completion index 0."""
    for pod in pods:
        if completion_index(pod) == 0 and (state := terminated(pod)):
            return contract.parse_report(state.get("message"))
    return None


def finisher(pods: Sequence[Mapping[str, Any]], elastic: bool) -> Mapping[str, Any] | None:
    """The succeeded pod whose report is the attempt's: the pod at completion index 0 (node rank 0). In an
    elastic job whose pod 0 has not ended (it left the world, or never started), the last world's rank 0 ran
    in another pod, and every pod's local rank 0 writes the world's verdict: the succeeded pod whose report
    says ``Succeeded`` at the furthest step, the lowest index first."""
    succeeded = [pod for pod in pods if _phase(pod) == "Succeeded"]
    first = next((pod for pod in succeeded if completion_index(pod) == 0), None)
    if first is not None or not elastic or any(completion_index(p) == 0 and terminated(p) for p in pods):
        return first
    said = [(pod, contract.parse_report((terminated(pod) or {}).get("message"))) for pod in succeeded]
    found = [
        (step if isinstance(step := report.get("step"), int) else 0, -completion_index(pod), pod)
        for pod, report in said
        if report is not None and report.get("result") == contract.SUCCEEDED
    ]
    return max(found, key=lambda entry: entry[:2])[2] if found else None


def remembered_report(previous: Mapping[str, Any], attempt: int) -> contract.Report | None:
    """Rank 0's report as an earlier reconcile recorded it in ``status.lastReport``: a pod stopped by the
    Job controller after a failure is deleted, and its termination message goes with it."""
    last = previous.get("lastReport")
    if not isinstance(last, dict) or last.get("attempt") != attempt:
        return None
    return contract.parse_report(json.dumps({k: v for k, v in last.items() if k != "attempt"}))


def lost_node_failure(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The attempt's failure when a pod of it was evicted from a node that stopped answering, as a Job
    condition would say it, or None. The Job controller never says it itself under the Job's
    ``podFailurePolicy``: it waits for the evicted pod to reach a terminal phase, which a pod on a lost
    node never does (its kubelet does not answer), and the Job would run on with one pod short forever."""
    if condition(job, "Complete") is not None:
        return None
    evicted = [pod for pod in pods if evicted_from_lost_node(pod)]
    if not evicted:
        return None
    names = ", ".join(
        f"{pod['metadata']['name']} on {pod.get('spec', {}).get('nodeName', '?')}" for pod in evicted
    )
    since = [str(pod["metadata"].get("deletionTimestamp") or "") for pod in evicted]
    return {
        "type": "FailureTarget",
        "status": "True",
        "reason": "NodeLost",
        "message": f"evicted from a node that does not answer: {names}",
        "lastTransitionTime": min(since),
    }


def outcome(
    job: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    report: contract.Report | None,
    failed: Mapping[str, Any] | None = None,
) -> Outcome:
    """A finished Job as the policy sees it, with rank 0's ``report`` (from its pod, or remembered);
    ``failed`` is its failure condition (default: the Job's own)."""
    codes = {
        completion_index(pod): int(state.get("exitCode", 0)) for pod in pods if (state := terminated(pod))
    }
    failed = failed if failed is not None else failure(job)
    reason = str(failed.get("reason", "")) if failed else ""
    errors = {completion_index(pod): error for pod in pods if (error := _first_error(pod))}
    culprits = [
        f"node {i} {exits.exited(code)}" + (f": {errors[i]}" if i in errors else "")
        for i, code in sorted(codes.items())
        if code
    ]
    message = ", ".join(culprits) or (str(failed.get("message", "")) if failed else "")
    if reason not in ("DeadlineExceeded", reasons.POD_FAILURE_POLICY):
        reason = reasons.PREEMPTED if any(condition(pod, "DisruptionTarget") for pod in pods) else ""
    return Outcome(
        succeeded=condition(job, "Complete") is not None,
        exit_codes=codes,
        report=report,  # with every pod's failed ranks already (observe)
        reason=reason,
        message=message,
        crashed=any(_failed_on_its_own(pod) for pod in pods),
    )


def _first_error(pod: Mapping[str, Any]) -> str:
    """The exception (or usage error) in a failed pod's termination message when it is a log tail
    (``FallbackToLogsOnError``), not a report: the failing rank's first error, not torchrun's summary."""
    state = terminated(pod)
    text = str((state or {}).get("message") or "")
    if not text or contract.parse_report(text) is not None:
        return ""
    found = podlogs.first_error(text.splitlines())
    return podlogs.strip_rank(found[-1]).strip()[:300] if found else ""


def _failed_on_its_own(pod: Mapping[str, Any]) -> bool:
    """A pod nobody deleted that exited non-zero, and not with the SIGTERM code (128 + 15) of a stop, nor
    after its own report says ``Interrupted``: when another pod of the gang is deleted, every rank agrees
    to stop at the next step, and torchrun exits 1 for a worker that exited 143 (the Job's
    podFailurePolicy lets the pods end on their own before it fails the Job)."""
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    state = terminated(pod)
    if state is None or int(state.get("exitCode", 0)) in (0, contract.INTERRUPTED_EXIT_CODE):
        return False
    report = contract.parse_report(state.get("message"))
    return report is None or report.get("result") != contract.INTERRUPTED


def current_attempt(previous: Mapping[str, Any], jobs: Sequence[Mapping[str, Any]]) -> int:
    """``max(status.attempt, the Jobs' attempt labels)``. The status is believed only as far as it can
    be true (a hand-edited one is repaired): at least the first attempt, and at most one beyond the
    newest Job (the status names attempt N + 1 once the operator decided to end Job N, before Job N + 1
    exists)."""
    first = contract.FIRST_ATTEMPT
    said = previous.get("attempt")
    said = max(said, first) if isinstance(said, int) and not isinstance(said, bool) else first
    labelled = [attempt_of(job) for job in jobs]
    if labelled and max(labelled) >= first:
        said = min(said, max(labelled) + 1)
    return max([said, *labelled])


def observe(
    previous: Mapping[str, Any],
    jobs: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    metrics_port: int = contract.DEFAULT_METRICS_PORT,
    references: Sequence[Reference] = (),
    mount_events: Sequence[Mapping[str, Any]] = (),
    elastic: bool = False,
) -> Facts:
    """The facts about one DDPJob, from its last status and the Jobs and pods that carry its label;
    ``references``: the Secrets and ConfigMaps its spec names (:func:`~.references.references`);
    ``mount_events``: the kubelet's ``FailedMount`` events on its pods (:func:`mounts.pods_to_read`);
    ``elastic``: a pod evicted from a lost node is not the attempt's failure (the others train on at the
    smaller world, and the Job replaces it once its node lets it go: :func:`lost_node_failure`; its report
    may be another pod's than pod 0's: :func:`finisher`)."""
    attempt = current_attempt(previous, jobs)
    current = [job for job in jobs if attempt_of(job) == attempt]
    mine = [pod for pod in pods if attempt_of(pod) == attempt]
    # every pod's failed ranks ride on rank 0's report (and into status.lastReport, past the pods' deletion)
    pod_reports = [
        contract.parse_report(str(s.get("message") or "")) for pod in mine if (s := terminated(pod))
    ]
    ended = finisher(mine, elastic)
    own = rank0_report(mine) or (
        contract.parse_report((terminated(ended) or {}).get("message")) if ended else None
    )
    merged = failures.with_failures(own, pod_reports) if pod_reports else own  # the ended pods' failures
    report = cast(contract.Report | None, merged) or remembered_report(previous, attempt)
    job_facts = None
    if current:
        job = current[0]
        lost = None if failure(job) or elastic else lost_node_failure(job, mine)
        failed = failure(job) or lost
        job_facts = JobFacts(
            name=job["metadata"]["name"],
            complete=condition(job, "Complete") is not None,
            failed=failed is not None,
            suspended=bool(job.get("spec", {}).get("suspend")),
            parallelism=job.get("spec", {}).get("parallelism"),
            outcome=outcome(job, mine, report, failed) if failed else None,
            failed_at=_time(failed.get("lastTransitionTime")) if failed else None,
            # after a lost node nothing stops the other pods but the Job's deletion: do not wait for them
            stopping_pods=0 if lost else sum(1 for pod in mine if _stopping(pod)),
            finished_index=completion_index(ended) if ended else None,
            finished_at=_time((terminated(ended) or {}).get("finishedAt")) if ended else None,
            never_started=sum(1 for pod in mine if _phase(pod) in ("Pending", "") and _stopping(pod)),
        )
    startup = first_failure(mine, references)
    if startup is None and mount_events:  # else why a volume waits, where the kubelet said it
        startup = mounts.failure(mount_events, mine, references)
    return Facts(
        attempt=attempt,
        job=job_facts,
        stale_jobs=tuple(job["metadata"]["name"] for job in jobs if attempt_of(job) < attempt),
        ready_nodes=sum(1 for pod in mine if ready(pod)),
        unschedulable=unschedulable(mine),
        report=report,
        targets=metrics_targets(mine, attempt, metrics_port),
        stale_deadlines=stale_deadlines(jobs, pods, attempt),
        startup=startup,
    )


STOP_MARGIN_SECONDS = 30
"""Beyond a pod's deletion deadline (its termination grace period), before deciding without it."""


def give_up_at(pod: Mapping[str, Any]) -> dt.datetime | None:
    """When waiting for a pod being deleted is pointless, or None (it is not being deleted). A pod the
    taint-eviction controller took from a lost node: at once (its kubelet does not answer, and no grace
    period brings an answer; ``spec.nodeLostTolerationSeconds`` was the wait). Any other: its deletion
    deadline plus :data:`STOP_MARGIN_SECONDS`; a pod past that is kept only by a kubelet that does not
    answer, for which the API server waits forever."""
    if evicted_from_lost_node(pod):
        evicted = condition(pod, "DisruptionTarget") or {}
        return _time(evicted.get("lastTransitionTime")) or _time(
            pod.get("metadata", {}).get("creationTimestamp")
        )
    deadline = _time(pod.get("metadata", {}).get("deletionTimestamp"))
    return deadline + dt.timedelta(seconds=STOP_MARGIN_SECONDS) if deadline else None


def stale_deadlines(
    jobs: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]], attempt: int
) -> tuple[tuple[str, dt.datetime], ...]:
    """For each Job of an earlier attempt that is being deleted and still has pods, all of them being
    deleted: the latest time after which waiting for them is pointless (:func:`give_up_at`)."""
    found = []
    for job in jobs:
        if attempt_of(job) >= attempt or not job.get("metadata", {}).get("deletionTimestamp"):
            continue
        left = [pod for pod in pods if attempt_of(pod) == attempt_of(job) and _phase(pod) not in GONE]
        deadlines = [give_up_at(pod) for pod in left]
        if left and all(deadlines):
            found.append((job["metadata"]["name"], max(d for d in deadlines if d)))
    return tuple(found)


def _stopping(pod: Mapping[str, Any]) -> bool:
    return not stopped(pod) and not evicted_from_lost_node(pod)


GONE = ("Succeeded", "Failed")


def _phase(pod: Mapping[str, Any]) -> str:
    return str(pod.get("status", {}).get("phase") or "")
