"""The compute probe on the real control plane: a faulty rank (the SDC fire drill) fails the attempt with
reason FaultyRank, the operator records the node and the next attempt's pods are scheduled away from it
(the other real node, which has room for both: 2 CPUs, 1 requested by each pod)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from helpers.e2e import Operator, children, real_ddpjob, wait_phase
from testcluster.fixtures import Cluster, wait_for
from testcluster.nodeconfig import RealNode

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _pods_of(cluster: Cluster, namespace: str, attempt: int) -> list[dict[str, Any]]:
    return [
        p
        for p in children(cluster, namespace, "pods", "sdc")
        if p["metadata"]["labels"].get("ddpjob.io/attempt") == str(attempt)
    ]


def test_a_faulty_rank_restarts_the_gang_away_from_its_node(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode]
) -> None:
    doc = real_ddpjob(
        "sdc",
        procsPerNode=2,  # 4 ranks: a strict majority can name one
        trainer={"steps": 400, "checkpointEvery": 0},
        syncCheck={"everySteps": 10, "probeEverySteps": 10},
        maxRestarts=1,
        env=[{"name": "DDPJOB_CHAOS_SDC", "value": "rank=3,step=5"}],  # rank 3: pod 1, local rank 1
    )
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))

    def faulty_pod_node() -> str | None:
        pods = [p for p in _pods_of(cluster, namespace, 1) if p["metadata"]["name"].startswith("sdc-1-1-")]
        return pods[0]["spec"].get("nodeName") if pods else None

    node = wait_for(faulty_pod_node, what="attempt 1's pod 1 scheduled", timeout=120)

    # Attempt 2's nodes, read while its pods run: once that Job has failed, the Job controller deletes a pod
    # still running (rank 0's, writing its report), and it is gone before the DDPJob's phase is read.
    def second_placed() -> list[str] | None:
        placed = [p["spec"].get("nodeName") for p in _pods_of(cluster, namespace, 2)]
        return placed if len(placed) == 2 and all(placed) else None

    second = wait_for(second_placed, what="attempt 2's two pods scheduled", timeout=240)
    status = wait_phase(cluster, namespace, "sdc", "Failed", "Succeeded", timeout=300)["status"]
    failed = {c["type"]: c for c in status["conditions"]}["Failed"]
    assert status["phase"] == "Failed" and failed["reason"] == "FaultyRank", status
    assert status["attempt"] == 2 and status["probe"]["faultyNodes"][0] == node, status
    assert status["sync"]["mismatches"] == 0, status  # the replica check saw nothing wrong
    job = cluster.kubectl_json("get", "job", "sdc-2", "-n", namespace)
    terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [node]}]}]
    assert node not in second, (node, second)
    events = cluster.kubectl_json("get", "events", "-n", namespace)["items"]
    said = [e["message"] for e in events if e.get("reason") == "FaultyRank"]
    assert any(f"node {node}" in m and "rank 3" in m for m in said), said
    print(f"attempt 1's rank 3 ran on {node}; attempt 2 ran on {second}")
