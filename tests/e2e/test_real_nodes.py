"""The first e2e runs on real nodes (a kubelet and containerd each, ``tests/cluster/realnode.py``): `helm
install` runs the operator from its image as the chart's Deployment on a real node, and the DDPJobs it
reconciles train across both real nodes from the trainer image, verified: the built-in trainer, and the
no-code example (``examples/no-code.yaml``: the init container copies the sync hook into a volume the
kubelet shares with the trainer container); and a rank killed in its container restarts in place, then a
deleted pod recreates the gang, resuming from a checkpoint on a hostPath the kubelet mounted; and the
quickstart with its claim bound to a PersistentVolume that the kubelets mount; and a lost node. Skipped,
saying why, where real nodes cannot run (``realfixture.real_nodes_or_skip``). The rest of the e2e tier
still runs its pods as processes of the node agents.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster import nodeimages, processes, realfixture
from cluster.fixtures import Cluster, manifests, wait_for
from cluster.nodeconfig import LABEL, RealNode
from ddp_trainer import launch

from .conftest import REPO, children, get, wait_phase
from .helmrelease import Release, installed
from .operator_process import ddpjob
from .test_faults import _descendants  # the host's /proc: a container's processes are the host's too

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ON_REAL_NODES = {"nodeSelector": {LABEL: "true"}, "tolerations": [realfixture.TOLERATION]}


@pytest.fixture(scope="module")
def real_nodes(cluster: Cluster) -> Iterator[list[RealNode]]:
    yield from realfixture.real_nodes_or_skip(cluster)


def host_uid(node: RealNode, container_id: str) -> str:
    cid = container_id.removeprefix("containerd://")
    for line in nodeimages.ctr(node.socket, "tasks", "ls").splitlines()[1:]:
        task, pid, *_ = line.split()
        if task == cid:
            status = Path(f"/proc/{pid}/status").read_text()
            return next(x.split()[1] for x in status.splitlines() if x.startswith("Uid:"))
    raise AssertionError(f"containerd of {node.name} runs no task {cid}")


@pytest.fixture(scope="module")
def release(cluster: Cluster, real_nodes: list[RealNode]) -> Iterator[Release]:
    with installed(cluster, "real", **ON_REAL_NODES) as installed_release:
        yield installed_release


def finished(cluster: Cluster, namespace: str, name: str, nodes: list[RealNode]) -> dict[str, Any]:
    """Waits for DDPJob ``name`` to end; checks it Succeeded, verified, with a pod on each real node."""
    final = wait_phase(cluster, namespace, name, "Succeeded", "Failed", timeout=480)
    pods = children(cluster, namespace, "pods", name)
    detail = {p["metadata"]["name"]: p["status"].get("containerStatuses") for p in pods}
    if final["status"]["phase"] != "Succeeded":
        logs = [cluster.kubectl("logs", "-n", namespace, p["metadata"]["name"], check=False) for p in pods]
        raise AssertionError(f"{final['status']}\n{detail}\n" + "\n".join(r.stdout[-2000:] for r in logs))
    assert final["status"]["sync"]["verified"] is True, final["status"]
    assert {p["spec"]["nodeName"] for p in pods} == {n.name for n in nodes}, detail
    for pod in pods:
        (trainer,) = pod["status"]["containerStatuses"]
        assert trainer["imageID"], trainer  # an image the node's containerd holds
        assert trainer["state"]["terminated"]["exitCode"] == 0, trainer
    return final


def test_the_chart_runs_the_operator_image_and_a_ddpjob_trains_on_real_nodes(
    cluster: Cluster, real_nodes: list[RealNode], release: Release
) -> None:
    by_name = {n.name: n for n in real_nodes}
    operator_pod = release.operator_pod()
    assert operator_pod["spec"]["nodeName"] in by_name, operator_pod["spec"].get("nodeName")
    (status,) = operator_pod["status"]["containerStatuses"]
    assert status["containerID"].startswith("containerd://")
    assert host_uid(by_name[operator_pod["spec"]["nodeName"]], status["containerID"]) == "1000"

    job: dict[str, Any] = ddpjob(
        "real",
        trainer={"steps": 30, "batchSize": 16, "checkpointEvery": 10},
        syncCheck={"everySteps": 10, "onDivergence": "Fail"},
        maxRestarts=0,
        podTemplate=ON_REAL_NODES,
    )
    cluster.kubectl("apply", "-n", release.jobs, "-f", "-", input=manifests(job))
    finished(cluster, release.jobs, "real", real_nodes)


def test_the_no_code_example_trains_on_real_nodes(
    cluster: Cluster, real_nodes: list[RealNode], release: Release
) -> None:
    """As shipped, but for placement and where the script comes from: the trainer image does not hold
    ``examples/plain_ddp.py`` (a user's image would hold their script), so a ConfigMap mounts it."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "no-code.yaml").read_text())
    script = REPO / "examples" / "plain_ddp.py"
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "user-script"},
        "data": {script.name: script.read_text()},
    }
    assert doc["spec"]["args"] == ["examples/plain_ddp.py"], doc["spec"]["args"]
    doc["spec"]["args"] = [f"/opt/user/{script.name}"]
    doc["spec"]["podTemplate"] = {
        **ON_REAL_NODES,
        "volumes": [{"name": "user-script", "configMap": {"name": "user-script"}}],
        "volumeMounts": [{"name": "user-script", "mountPath": "/opt/user", "readOnly": True}],
    }
    cluster.kubectl("apply", "-n", release.jobs, "-f", "-", input=manifests(config_map, doc))
    name = doc["metadata"]["name"]
    final = finished(cluster, release.jobs, name, real_nodes)
    (job,) = children(cluster, release.jobs, "jobs", name)
    (init,) = job["spec"]["template"]["spec"]["initContainers"]
    assert init["command"][:3] == ["python", "-m", "ddp_trainer.inject"], init
    assert final["status"]["sync"]["checks"] >= 2, final["status"]


def test_a_killed_rank_restarts_in_place_and_a_deleted_pod_recreates_the_gang(
    cluster: Cluster, real_nodes: list[RealNode], release: Release, tmp_path: Path
) -> None:
    """As ``test_faults``' test of the same name, in containers: the rank (a process of the trainer
    container, found from the host through containerd) SIGKILLed, the same pods restart every rank in
    place from the checkpoint on a hostPath the kubelet mounted; then a pod deleted recreates the Job.
    On the way: ``spec.shmSize`` is the size of the container's /dev/shm."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    folder.chmod(0o777)  # the trainer runs as uid 1000
    doc = ddpjob(
        "inplace",
        checkpoint={"volume": {"hostPath": {"path": str(folder)}}, "mountPath": "/ckpt"},
        trainer={"steps": 1200, "checkpointEvery": 50},
        syncCheck={"everySteps": 50},
        shmSize="512Mi",
        podTemplate=ON_REAL_NODES,
    )
    ns = release.jobs
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=manifests(doc))
    wait_for(lambda: list(folder.glob("step-*.pt")), what="a checkpoint", timeout=300)
    pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in children(cluster, ns, "pods", "inplace")}
    (victim,) = [
        p
        for p in children(cluster, ns, "pods", "inplace")
        if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1"
    ]
    node = {n.name: n for n in real_nodes}[victim["spec"]["nodeName"]]
    (container,) = victim["status"]["containerStatuses"]
    cid = container["containerID"].removeprefix("containerd://")
    main = next(
        int(line.split()[1])
        for line in nodeimages.ctr(node.socket, "tasks", "ls").splitlines()[1:]
        if line.split()[0] == cid
    )
    # spec.shmSize: a memory emptyDir at /dev/shm, which the kubelet mounts as a tmpfs of that size
    shm = [line.split() for line in Path(f"/proc/{main}/mountinfo").read_text().splitlines()]
    (shm_mount,) = [m for m in shm if m[4] == "/dev/shm"]
    assert shm_mount[-3] == "tmpfs" and "size=524288k" in shm_mount[-1], shm_mount
    ranks = [p for p in _descendants(main) if processes.name(p).startswith(launch.WORKER_NAME_PREFIX)]
    assert len(ranks) == 1, (main, _descendants(main))
    os.kill(ranks[0], signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        status = get(cluster, ns, "inplace").get("status", {})
        return status if status.get("restartsInPlace") == 1 else None

    status = wait_for(restarted, what="the operator to count a restart in place", timeout=120, every=1)
    assert status["lastRestart"]["kind"] == "InPlace", status["lastRestart"]
    assert "rank 1 killed by signal 9" in status["lastRestart"]["message"], status["lastRestart"]
    now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in children(cluster, ns, "pods", "inplace")}
    assert now == pods, "the pods were replaced: the restart was not in place"

    cluster.kubectl("delete", "pod", "-n", ns, victim["metadata"]["name"])
    status = wait_phase(cluster, ns, "inplace", "Succeeded", "Failed", timeout=480)["status"]
    assert status["phase"] == "Succeeded", status
    assert (status["attempt"], status["restarts"], status["restartsInPlace"]) == (2, 2, 1), status
    assert status["lastRestart"]["kind"] == "Recreate" and status["sync"]["verified"] is True, status
    assert status["checkpoint"]["resumedFromStep"] > 0, status


def test_the_quickstart_trains_on_real_nodes_with_its_claim_mounted_by_the_kubelets(
    cluster: Cluster, real_nodes: list[RealNode], release: Release, tmp_path: Path
) -> None:
    """``examples/quickstart.yaml`` as shipped but for placement and a shorter run: its 1Gi ReadWriteOnce
    claim bound to a hostPath PersistentVolume (what a default class would give), which each node's
    kubelet mounts into its pod; the checkpoints the containers wrote (as uid 1000) are on the volume."""
    folder = tmp_path / "pv"
    folder.mkdir()
    folder.chmod(0o777)
    ns = release.jobs
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"rwo-{ns}"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": str(folder)},
            "claimRef": {"namespace": ns, "name": "quickstart-checkpoints"},
        },
    }
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    doc["spec"]["trainer"].update(steps=40, checkpointEvery=20)
    doc["spec"]["syncCheck"]["everySteps"] = 20
    doc["spec"]["podTemplate"] = ON_REAL_NODES
    try:
        cluster.kubectl("apply", "-f", "-", input=manifests(volume))
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=manifests(doc))
        finished(cluster, ns, "quickstart", real_nodes)
        written = sorted(folder.glob("step-*.pt"))
        assert [p.name for p in written] == ["step-00000020.quickstart.pt", "step-00000040.quickstart.pt"]
        assert {p.stat().st_uid for p in written} == {1000}
    finally:
        cluster.kubectl("delete", "ddpjob", "quickstart", "-n", ns, "--wait=false", check=False)
        cluster.kubectl("delete", "pv", f"rwo-{ns}", "--wait=false", check=False)


def test_a_lost_real_node_restarts_the_gang_on_the_node_that_remains(
    cluster: Cluster, real_nodes: list[RealNode], release: Release, tmp_path: Path
) -> None:
    """As ``test_faults``' test of the same name, with a kubelet that stops renewing its Lease and
    containers that die with their node. The node lost is the one without the operator's pod."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    folder.chmod(0o777)
    ns = release.jobs
    doc = ddpjob(
        "lost",
        checkpoint={"volume": {"hostPath": {"path": str(folder)}}, "mountPath": "/ckpt"},
        trainer={"steps": 160, "checkpointEvery": 20},
        syncCheck={"everySteps": 20},
        nodeLostTolerationSeconds=10,
        podTemplate=ON_REAL_NODES,
    )
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=manifests(doc))
    wait_for(lambda: list(folder.glob("step-*.pt")), what="a checkpoint", timeout=300)
    operator_node = release.operator_pod()["spec"]["nodeName"]
    (node,) = [n for n in real_nodes if n.name != operator_node]
    assert any(p["spec"]["nodeName"] == node.name for p in children(cluster, ns, "pods", "lost"))
    try:
        realfixture.lose_node(node)
        status = wait_phase(cluster, ns, "lost", "Succeeded", "Failed", timeout=480)["status"]
        assert status["phase"] == "Succeeded", status
        assert status["attempt"] >= 2 and status["checkpoint"]["resumedFromStep"] > 0, status
        pods = children(cluster, ns, "pods", "lost")
        final = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        assert final and all(p["spec"]["nodeName"] == operator_node for p in final), final
    finally:
        realfixture.restore_node(cluster, node)
    wait_for(
        lambda: not [p for p in children(cluster, ns, "pods", "lost") if p["spec"]["nodeName"] == node.name],
        what=f"the pods left on {node.name} to be removed once it is back",
        timeout=90,
    )
