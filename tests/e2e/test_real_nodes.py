"""The first e2e run on real nodes (a kubelet and containerd each, ``tests/cluster/realnode.py``): `helm
install` runs the operator from its image as the chart's Deployment on a real node, and a DDPJob it
reconciles trains across both real nodes from the trainer image, verified. Skipped, saying why, where
real nodes cannot run (``realfixture.real_nodes_or_skip``). The rest of the e2e tier still runs its pods
as processes of the node agents.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster import nodeimages, realfixture
from cluster.fixtures import Cluster, manifests
from cluster.nodeconfig import LABEL, RealNode

from .conftest import children, wait_phase
from .helmrelease import installed
from .operator_process import ddpjob

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


def test_the_chart_runs_the_operator_image_and_a_ddpjob_trains_on_real_nodes(
    cluster: Cluster, real_nodes: list[RealNode]
) -> None:
    by_name = {n.name: n for n in real_nodes}
    with installed(cluster, "real", **ON_REAL_NODES) as release:
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
        final = wait_phase(cluster, release.jobs, "real", "Succeeded", "Failed", timeout=480)
        pods = children(cluster, release.jobs, "pods", "real")
        detail = {p["metadata"]["name"]: p["status"].get("containerStatuses") for p in pods}
        assert final["status"]["phase"] == "Succeeded", (final["status"], detail)
        assert final["status"]["sync"]["verified"] is True, final["status"]
        assert {p["spec"]["nodeName"] for p in pods} == set(by_name), detail
        for pod in pods:
            (trainer,) = [c for c in pod["status"]["containerStatuses"] if c["name"] != "hook"]
            assert trainer["imageID"], trainer  # an image the node's containerd holds
            assert trainer["state"]["terminated"]["exitCode"] == 0, trainer
