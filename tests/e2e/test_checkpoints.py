"""Checkpoints on the real control plane: a claim the operator creates, bound by the real controller-manager,
mounted by the real nodes' kubelets into the trainer containers; a pod deleted mid-run (SIGTERM) leaves a
checkpoint and the gang restarts from it as a preemption; another job's checkpoint is refused; a corrupt
newest checkpoint is skipped."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from helpers.e2e import Operator, container_pid, get, real_ddpjob, wait_phase, writable_folder
from helpers.e2e_pods import apply_doc, checkpointing_trainer, descendants, events_text, pod_name_at
from testcluster.fixtures import Cluster, host_path_volume, wait_for
from testcluster.nodeconfig import RealNode

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _volume(cluster: Cluster, namespace: str, folder: Path) -> str:
    """A PersistentVolume on ``folder`` that only this test's claims can bind; returns its StorageClass."""
    storage_class = f"ckpt-{namespace}"
    pv = host_path_volume(f"ckpt-{namespace}", storage_class, str(writable_folder(folder)))
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pv))
    return storage_class


def test_a_deleted_pod_restarts_the_gang_from_the_claim_as_a_preemption(
    cluster: Cluster, operator: Operator, namespace: str, tmp_path: Path, real_nodes: list[RealNode]
) -> None:
    folder = tmp_path / "pv"
    storage_class = _volume(cluster, namespace, folder)
    try:
        claim = {"storageClassName": storage_class, "size": "1Gi"}
        apply_doc(
            cluster, namespace, real_ddpjob("durable", **checkpointing_trainer(volumeClaimTemplate=claim))
        )
        wait_for(
            lambda: list(folder.glob("step-*.pt")), what="a checkpoint on the claim's volume", timeout=240
        )
        (pvc,) = cluster.kubectl_json("get", "pvc", "-n", namespace)["items"]
        assert pvc["metadata"]["name"] == "durable-checkpoints" and pvc["status"]["phase"] == "Bound"
        assert pvc["metadata"]["ownerReferences"][0]["name"] == "durable"
        victim = pod_name_at(cluster, namespace, "durable", 1)
        cluster.kubectl("delete", "pod", "-n", namespace, victim, "--wait=false")  # graceful: SIGTERM
        status = wait_phase(cluster, namespace, "durable", "Succeeded", "Failed", timeout=300)["status"]
        assert status["phase"] == "Succeeded", status
        events = events_text(cluster, namespace, "durable")
        counts = (status["attempt"], status["restarts"], status.get("preemptions"))
        assert counts == (2, 1, 1), f"{events}\n{json.dumps(status, indent=1)}"
        assert status["checkpoint"]["resumedFromStep"] > 0, status
        assert "Preempted" in events_text(cluster, namespace, "durable")
        cluster.kubectl("delete", "ddpjob", "durable", "-n", namespace, "--wait=true", "--timeout=60s")
        wait_for(
            lambda: not cluster.kubectl_json("get", "pvc", "-n", namespace)["items"],
            what="the owned claim to go with its DDPJob",
            timeout=60,
        )
    finally:
        cluster.kubectl("delete", "pv", f"ckpt-{namespace}", "--wait=false")


def test_an_empty_dir_job_says_restarts_start_from_step_0(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode]
) -> None:
    apply_doc(
        cluster, namespace, real_ddpjob("ephemeral", command=["python", "-c", "import time; time.sleep(30)"])
    )
    wait_phase(cluster, namespace, "ephemeral", "Running", timeout=120)
    conditions = {c["type"]: c for c in get(cluster, namespace, "ephemeral")["status"]["conditions"]}
    durable = conditions["CheckpointsDurable"]
    assert durable["status"] == "False" and "restarts will start from step 0" in durable["message"]


def _hostpath(folder: Path) -> dict[str, Any]:
    return {"volume": {"hostPath": {"path": str(writable_folder(folder))}}, "mountPath": "/checkpoints"}


def _short(name: str, folder: Path, steps: int = 40, **checkpoint: Any) -> dict[str, Any]:
    spec = checkpointing_trainer(**_hostpath(folder), **checkpoint)
    spec["trainer"].update(steps=steps)
    return real_ddpjob(name, **spec)


def test_another_jobs_checkpoint_is_refused_and_a_warm_start_is_said(
    cluster: Cluster, operator: Operator, namespace: str, tmp_path: Path, real_nodes: list[RealNode]
) -> None:
    folder = tmp_path / "shared"
    apply_doc(cluster, namespace, _short("teacher", folder))
    assert wait_phase(cluster, namespace, "teacher", "Succeeded", "Failed", timeout=240)["status"][
        "phase"
    ] == ("Succeeded")
    apply_doc(cluster, namespace, _short("student", folder, steps=20))
    status = wait_phase(cluster, namespace, "student", "Failed", "Succeeded", timeout=240)["status"]
    failed = {c["type"]: c for c in status["conditions"]}["Failed"]
    assert status["phase"] == "Failed" and status["attempt"] == 1, status  # never restarted
    assert failed["reason"] == "ForeignCheckpoint", failed
    assert f"{namespace}/teacher" in failed["message"] and f"{namespace}/student" in failed["message"], failed
    apply_doc(cluster, namespace, _short("apprentice", folder, steps=20, warmStartFrom="teacher"))
    status = wait_phase(cluster, namespace, "apprentice", "Succeeded", "Failed", timeout=240)["status"]
    assert status["phase"] == "Succeeded", status
    assert status["checkpoint"]["warmStartedFrom"] == f"{namespace}/teacher", status
    assert "WarmStarted" in events_text(cluster, namespace, "apprentice")


def test_a_corrupt_newest_checkpoint_falls_back_to_the_one_before(
    cluster: Cluster, operator: Operator, namespace: str, tmp_path: Path, real_nodes: list[RealNode]
) -> None:
    folder = tmp_path / "ckpt"
    doc = _short("fallback", folder, steps=300)  # rank 0 goes at step ~100, attempt 2 resumes from 50
    doc["spec"]["trainer"]["checkpointEvery"] = 50
    doc["spec"]["syncCheck"]["everySteps"] = 50
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
    wait_for(lambda: len(list(folder.glob("step-*.pt"))) >= 2, what="two checkpoints", timeout=240)
    rank0 = pod_name_at(cluster, namespace, "fallback", 0)
    # SIGKILL every process of rank 0's container first (its main one and the ranks below it: no save
    # after this), then flip one byte of the newest checkpoint.
    main = container_pid(real_nodes, cluster.pod(namespace, rank0))
    for pid in [main, *descendants(main)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def killed() -> dict[str, Any] | None:
        (trainer,) = cluster.pod(namespace, rank0)["status"]["containerStatuses"]
        terminated: dict[str, Any] | None = trainer["state"].get("terminated")
        return terminated

    ended = wait_for(killed, what=f"{rank0}'s container to end", timeout=60)
    assert ended["exitCode"] == 137, ended
    *older, newest = sorted(folder.glob("step-*.pt"))
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x01
    newest.write_bytes(bytes(data))
    status = wait_phase(cluster, namespace, "fallback", "Succeeded", "Failed", timeout=420)["status"]
    assert status["phase"] == "Succeeded" and status["attempt"] == 2, status
    resumed = int(older[-1].name.split(".")[0].removeprefix("step-"))
    assert status["checkpoint"]["resumedFromStep"] == resumed, status
    assert any(newest.name in skipped for skipped in status["checkpoint"]["skipped"]), status
    assert "CheckpointSkipped" in events_text(cluster, namespace, "fallback")
