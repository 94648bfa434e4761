"""Bad GPUs kept out, for every job (issue 45, item 4), on the real nodes: with ``--node-health`` (the
chart's ``nodeHealth.enabled``, its grant applied as the chart renders it), the CPU SDC drill's ``faulty``
verdict taints the rank's node ``ddpjob.io/faulty-gpu=cpu:NoSchedule``, sets its ``DDPJobFaultyGPU``
condition and posts an Event on it; a second DDPJob then runs only on the other node; once a person removes
the taint, the operator sets the condition False and a third DDPJob spreads over both nodes again."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.e2e import children, real_ddpjob, session_operator_paused, wait_phase
from helpers.operator_process import OPERATOR_NAMESPACE, SERVICE_ACCOUNT, Operator, chart_rbac, install
from testcluster.fixtures import Cluster, wait_for
from testcluster.nodeconfig import RealNode

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TAINT = "ddpjob.io/faulty-gpu"
CONDITION = "DDPJobFaultyGPU"


@contextlib.contextmanager
def node_health_operator(cluster: Cluster, log: Path) -> Iterator[Operator]:
    """The operator with ``--node-health``, as the chart's ServiceAccount with the chart's nodeHealth grant
    (the session's operator paused meanwhile: two must not reconcile the same DDPJobs)."""
    with session_operator_paused():
        install(cluster)
        grant = chart_rbac("--set", "nodeHealth.enabled=true")
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(grant))
        kubeconfig = cluster.serviceaccount_kubeconfig(OPERATOR_NAMESPACE, SERVICE_ACCOUNT)
        running = Operator(kubeconfig, log, args=("--node-health",))
        running.start()
        try:
            yield running
        finally:
            running.stop()
            extra = [
                o for o in grant if o["kind"] in ("Role", "RoleBinding") or "-nodes" in o["metadata"]["name"]
            ]
            cluster.kubectl(
                "delete", "-f", "-", "--ignore-not-found", input=yaml.safe_dump_all(extra), check=False
            )


def _node(cluster: Cluster, name: str) -> dict[str, Any]:
    found: dict[str, Any] = cluster.kubectl_json("get", "node", name)
    return found


def _condition(node: dict[str, Any]) -> dict[str, Any]:
    return {c["type"]: c for c in node["status"].get("conditions", [])}.get(CONDITION, {})


def _nodes_of(cluster: Cluster, namespace: str, name: str) -> set[str]:
    return {
        p["spec"]["nodeName"] for p in children(cluster, namespace, "pods", name) if p["spec"].get("nodeName")
    }


def test_a_faulty_verdict_taints_the_node_for_every_job_until_a_person_removes_the_taint(
    cluster: Cluster, namespace: str, real_nodes: list[RealNode], tmp_path: Path
) -> None:
    with node_health_operator(cluster, tmp_path / "operator.log") as operator:
        drill = real_ddpjob(
            "sdc",
            procsPerNode=2,  # 4 ranks: a strict majority can name one
            trainer={"steps": 400, "checkpointEvery": 0},
            syncCheck={"everySteps": 10, "probeEverySteps": 10},
            maxRestarts=0,
            env=[{"name": "DDPJOB_CHAOS_SDC", "value": "rank=3,step=5"}],  # rank 3: pod 1, local rank 1
        )
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(drill))
        status = wait_phase(cluster, namespace, "sdc", "Failed", "Succeeded", timeout=300)["status"]
        failed = {c["type"]: c for c in status["conditions"]}["Failed"]
        assert failed["reason"] == "FaultyRank", (status, operator.log.read_text()[-3000:])
        bad = status["probe"]["faultyNodes"][0]
        (good,) = [n.name for n in real_nodes if n.name != bad]
        node = _node(cluster, bad)
        taints = [t for t in node["spec"].get("taints", []) if t["key"] == TAINT]
        assert taints == [{"key": TAINT, "value": "cpu", "effect": "NoSchedule"}], (
            node["spec"],
            operator.log.read_text()[-3000:],
        )
        assert _condition(node)["status"] == "True" and "rank 3" in _condition(node)["message"], node[
            "status"
        ]
        events = cluster.kubectl_json(
            "get", "events", "-n", "default", "--field-selector", f"involvedObject.name={bad}"
        )["items"]
        assert any(e["reason"] == "ComputeProbeFaulty" and TAINT in e["message"] for e in events), events

        # every job now keeps off it: its pods would fit on either node (2 CPUs each, 0.5 asked per pod)
        cluster.kubectl(
            "apply", "-n", namespace, "-f", "-", input=json.dumps(real_ddpjob("after", trainer={"steps": 20}))
        )
        after = wait_phase(cluster, namespace, "after", "Succeeded", "Failed", timeout=300)["status"]
        assert after["phase"] == "Succeeded", after
        assert _nodes_of(cluster, namespace, "after") == {good}
        (job,) = children(cluster, namespace, "jobs", "after")
        assert bad in json.dumps(job["spec"]["template"]["spec"].get("affinity")), job["spec"]["template"][
            "spec"
        ]

        # a person lets the node back: the taint removed is all it takes; the condition follows
        cluster.kubectl("taint", "node", bad, f"{TAINT}-")
        wait_for(
            lambda: _condition(_node(cluster, bad)).get("status") == "False",
            what=f"the operator to set {CONDITION} False on {bad} once its taint was removed",
            timeout=60,
        )
        spread = {
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "back"}},
                }
            ]
        }
        back = real_ddpjob("back", trainer={"steps": 20}, podTemplate=spread)
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(back))
        done = wait_phase(cluster, namespace, "back", "Succeeded", "Failed", timeout=300)["status"]
        assert done["phase"] == "Succeeded", done
        assert _nodes_of(cluster, namespace, "back") == {bad, good}


@pytest.fixture(autouse=True)
def _untainted(cluster: Cluster, real_nodes: list[RealNode]) -> Iterator[None]:
    """Whatever happens, no real node stays tainted for the tests after this one."""
    yield
    for node in real_nodes:
        cluster.kubectl("taint", "node", node.name, f"{TAINT}-", check=False)
