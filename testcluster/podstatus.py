"""Pod status from what the node agent observed, following the kubelet's rules. Pure functions.

A container is ready when it runs (readiness probes are not run: the agent has no prober). The phase:
Pending until every init container succeeded and every container started; Succeeded when all containers
exited 0 and none will restart; Failed when all exited, one of them non-zero, and none will restart;
otherwise Running.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

MESSAGE_LIMIT = 4096  # bytes of a termination message the kubelet keeps
LOG_FALLBACK_LINES = 80
LOG_FALLBACK_BYTES = 2048


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ContainerRun:
    """What one container did. ``state`` is ``waiting``, ``running`` or ``terminated``."""

    name: str
    image: str = ""
    state: str = "waiting"
    reason: str = "ContainerCreating"
    message: str = ""
    exit_code: int | None = None
    signal: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    restart_count: int = 0
    container_id: str = ""
    last_state: dict[str, Any] = field(default_factory=dict)

    def started(self, container_id: str, at: str) -> None:
        self.state, self.reason, self.message = "running", "", ""
        self.container_id, self.started_at, self.finished_at = container_id, at, None
        self.exit_code = self.signal = None

    def exited(self, returncode: int, message: str, at: str, reason: str = "") -> None:
        """``returncode`` as Popen reports it: negative for a signal, reported as 128 + signal."""
        self.state = "terminated"
        self.signal = -returncode if returncode < 0 else None
        self.exit_code = 128 - returncode if returncode < 0 else returncode
        self.reason = reason or ("Completed" if self.exit_code == 0 else "Error")
        self.message = message
        self.finished_at = at

    def restarting(self) -> None:
        """Keeps the terminated state as ``lastState`` and waits for the next start."""
        self.last_state = {"terminated": _terminated(self)}
        self.restart_count += 1
        self.state, self.reason, self.message = "waiting", "ContainerCreating", ""


def _terminated(run: ContainerRun) -> dict[str, Any]:
    state: dict[str, Any] = {
        "exitCode": run.exit_code if run.exit_code is not None else 0,
        "reason": run.reason,
        "startedAt": run.started_at,
        "finishedAt": run.finished_at,
        "containerID": run.container_id or None,
    }
    if run.signal is not None:
        state["signal"] = run.signal
    if run.message:
        state["message"] = run.message
    return {k: v for k, v in state.items() if v is not None}


def container_status(run: ContainerRun, *, init: bool = False) -> dict[str, Any]:
    if run.state == "running":
        state: dict[str, Any] = {"running": {"startedAt": run.started_at}}
    elif run.state == "terminated":
        state = {"terminated": _terminated(run)}
    else:
        waiting = {"reason": run.reason}
        if run.message:  # the kubelet's words too: `secret "x" not found` for a CreateContainerConfigError
            waiting["message"] = run.message
        state = {"waiting": waiting}
    succeeded = run.state == "terminated" and run.exit_code == 0
    status: dict[str, Any] = {
        "name": run.name,
        "image": run.image,
        "imageID": "",
        "state": state,
        "lastState": run.last_state,
        "ready": succeeded if init else run.state == "running",
        "restartCount": run.restart_count,
        "started": run.state == "running",
    }
    if run.container_id:
        status["containerID"] = run.container_id
    return status


def will_restart(restart_policy: str, exit_code: int) -> bool:
    return restart_policy == "Always" or (restart_policy == "OnFailure" and exit_code != 0)


def pod_phase(restart_policy: str, init_runs: Sequence[ContainerRun], runs: Sequence[ContainerRun]) -> str:
    if any(r.state == "terminated" and r.exit_code != 0 for r in init_runs) and restart_policy == "Never":
        return "Failed"
    if any(r.state != "terminated" or r.exit_code != 0 for r in init_runs):
        return "Pending"
    if any(r.state == "waiting" and r.restart_count == 0 for r in runs):
        return "Pending"
    if any(r.state != "terminated" for r in runs):
        return "Running"
    if any(will_restart(restart_policy, r.exit_code or 0) for r in runs):
        return "Running"
    return "Succeeded" if all(r.exit_code == 0 for r in runs) else "Failed"


def _condition(
    previous: Mapping[str, Mapping[str, Any]],
    kind: str,
    ok: bool,
    reason: str = "",
    message: str = "",
    now: str = "",
) -> dict[str, Any]:
    status = "True" if ok else "False"
    before = previous.get(kind) or {}
    changed = before.get("status") != status
    condition: dict[str, Any] = {
        "type": kind,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": now
        if changed or not before.get("lastTransitionTime")
        else before["lastTransitionTime"],
    }
    if reason and not ok:
        condition["reason"] = reason
    if message and not ok:
        condition["message"] = message
    return condition


MANAGED_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


def pod_status(
    previous: Mapping[str, Any],
    *,
    restart_policy: str,
    init_runs: Sequence[ContainerRun],
    runs: Sequence[ContainerRun],
    pod_ip: str,
    host_ip: str,
    start_time: str,
    sandbox_ready: bool = True,
    phase: str | None = None,
    reason: str = "",
    message: str = "",
    now: str | None = None,
) -> dict[str, Any]:
    """The whole ``status`` of a pod. ``previous`` is the pod's current status (conditions the agent does
    not manage, such as PodScheduled, are kept; transition times change only on a change).
    ``phase``/``reason``/``message`` override the computed phase (e.g. Failed, DeadlineExceeded)."""
    now = now or now_rfc3339()
    phase = phase or pod_phase(restart_policy, init_runs, runs)
    terminal = phase in ("Succeeded", "Failed")
    before = {c["type"]: c for c in previous.get("conditions") or []}
    unready = [r.name for r in runs if r.state != "running"]
    uninit = [r.name for r in init_runs if r.state != "terminated" or r.exit_code != 0]
    why = "PodCompleted" if terminal else "ContainersNotReady"
    what = "" if terminal else f"containers with unready status: [{' '.join(unready)}]"
    conditions = [c for c in previous.get("conditions") or [] if c["type"] not in MANAGED_CONDITIONS]
    conditions += [
        _condition(before, "PodReadyToStartContainers", sandbox_ready and not terminal, now=now),
        _condition(
            before,
            "Initialized",
            not uninit or (terminal and not init_runs),
            "ContainersNotInitialized",
            f"containers with incomplete status: [{' '.join(uninit)}]",
            now,
        ),
        _condition(before, "ContainersReady", not unready and not terminal, why, what, now),
        _condition(before, "Ready", not unready and not terminal, why, what, now),
    ]
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": conditions,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": start_time,
        "containerStatuses": [container_status(r) for r in runs],
        "qosClass": previous.get("qosClass"),
    }
    if init_runs:
        status["initContainerStatuses"] = [container_status(r, init=True) for r in init_runs]
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    return {k: v for k, v in status.items() if v is not None}


def termination_message(file_text: bytes, log_tail: bytes, *, policy: str, exit_code: int) -> str:
    """The container's termination message: its file, or (FallbackToLogsOnError, failed, empty file) the
    tail of its log, truncated as the kubelet does."""
    text = file_text[:MESSAGE_LIMIT]
    if not text.strip() and policy == "FallbackToLogsOnError" and exit_code != 0:
        text = b"\n".join(log_tail.splitlines()[-LOG_FALLBACK_LINES:])[-LOG_FALLBACK_BYTES:]
    return text.decode(errors="replace")
