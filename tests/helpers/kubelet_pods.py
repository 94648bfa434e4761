"""Pods as the kubelet writes them (waiting, mounting, failed to mount) for the start-up tests."""

from __future__ import annotations

from typing import Any

from ddp_operator.api import names

IMAGE = "ddpjob/traner:0.1.0"


NOT_FOUND = (
    f'rpc error: code = NotFound desc = failed to pull and unpack image "docker.io/{IMAGE}": failed to '
    f'resolve reference "docker.io/{IMAGE}": docker.io/{IMAGE}: not found'
)


def kubelet_pod(
    index: int = 0,
    *,
    waiting: tuple[str, str] | None = None,
    init_waiting: tuple[str, str] | None = None,
    image: str = IMAGE,
    init: str = names.SYNC_HOOK_INIT_CONTAINER,
    attempt: int = 1,
) -> dict[str, Any]:
    """A pending pod of an Indexed Job as the API server returns it while the kubelet waits: its trainer
    container (or init container) waiting with ``(reason, message)``; otherwise the init container has
    completed and the trainer is ``ContainerCreating``."""

    def state(said: tuple[str, str] | None, default: dict[str, Any]) -> dict[str, Any]:
        return {"waiting": {"reason": said[0], "message": said[1]}} if said else default

    creating = {"waiting": {"reason": "ContainerCreating"}}
    done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    trainer = {
        "name": names.CONTAINER_NAME,
        "image": image,
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "started": False,
        "state": state(
            waiting, creating if init_waiting is None else {"waiting": {"reason": "PodInitializing"}}
        ),
    }
    sync = {
        "name": init,
        "image": "ddpjob/trainer:0.1.0",
        "imageID": "",
        "ready": init_waiting is None,
        "restartCount": 0,
        "started": False,
        "state": state(init_waiting, done),
    }
    return {
        "metadata": {
            "name": f"job-{attempt}-{index}-x7k2p",
            "namespace": "team-a",
            "labels": {names.ATTEMPT_LABEL: str(attempt), names.JOB_NAME_LABEL: "job"},
            "annotations": {names.COMPLETION_INDEX_ANNOTATION: str(index)},
        },
        "spec": {
            "initContainers": [{"name": init, "image": "ddpjob/trainer:0.1.0"}],
            "containers": [{"name": names.CONTAINER_NAME, "image": image}],
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "True"},
                {"type": "Initialized", "status": "True" if init_waiting is None else "False"},
                {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
                {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady"},
                {"type": "PodScheduled", "status": "True"},
            ],
            "initContainerStatuses": [sync],
            "containerStatuses": [trainer],
        },
    }


MOUNT_NOT_FOUND = 'MountVolume.SetUp failed for volume "checkpoint" : secret "bucket-creds" not found'


def mounting_pod(index: int = 0, scheduled: str = "2026-11-22T11:59:00Z") -> dict[str, Any]:
    """A pod whose volumes wait: scheduled, no sandbox yet, its init container PodInitializing."""
    pod = kubelet_pod(index, init_waiting=("PodInitializing", ""))
    pod["status"]["conditions"] = [
        {"type": "PodReadyToStartContainers", "status": "False", "lastTransitionTime": scheduled},
        {"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized"},
        {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
        {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady"},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled},
    ]
    return pod


def failed_mount(
    message: str, pod: str = "job-1-0-x7k2p", at: str = "2026-11-22T11:59:30Z"
) -> dict[str, Any]:
    return {
        "type": "Warning",
        "reason": "FailedMount",
        "message": message,
        "involvedObject": {"kind": "Pod", "namespace": "team-a", "name": pod},
        "source": {"component": "kubelet", "host": "node-1"},
        "count": 3,
        "lastTimestamp": at,
    }
