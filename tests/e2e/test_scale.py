"""An elastic DDPJob resized by `kubectl scale` on the real control plane (the /scale subresource): the
same Indexed Job (same uid) grows and shrinks, no new attempt, and the job Succeeds, verified. The pods
run on the node agents (processes of this checkout's environment)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from helpers.e2e import Operator, children, ddpjob, get, wait_phase
from testcluster.fixtures import Cluster, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _scaled_to(cluster: Cluster, namespace: str, name: str, nodes: int) -> dict[str, Any]:
    """Wait until the Job has ``nodes`` pods and the DDPJob says that many train."""

    def there() -> dict[str, Any] | None:
        (job,) = children(cluster, namespace, "jobs", name)
        status = get(cluster, namespace, name).get("status", {})
        sized = job["spec"]["parallelism"] == job["spec"]["completions"] == nodes
        return job if sized and status.get("elastic", {}).get("nodes") == nodes else None

    return wait_for(there, what=f"{name} at {nodes} node(s)", timeout=240, every=0.5)


def test_kubectl_scale_resizes_the_same_job_and_the_job_succeeds(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    # the node agents mount no hostPath: each pod checkpoints to its own emptyDir, and a new world whose rank
    # 0 is a new pod starts from step 0 (the real-node test of a lost node resumes from a shared volume)
    doc = ddpjob(
        "elastic",
        nodes=2,
        elastic={"minNodes": 1, "maxNodes": 3},
        trainer={"steps": 500, "batchSize": 16, "checkpointEvery": 10},
        syncCheck={"everySteps": 20},
    )
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
    wait_phase(cluster, namespace, "elastic", "Running", timeout=180)
    (first,) = children(cluster, namespace, "jobs", "elastic")
    # a rigid job refuses it; this one takes it: spec.nodes through the /scale subresource
    cluster.kubectl("scale", "ddpjob", "elastic", "-n", namespace, "--replicas=3")
    grown = _scaled_to(cluster, namespace, "elastic", 3)
    assert grown["metadata"]["uid"] == first["metadata"]["uid"]
    cluster.kubectl("scale", "ddpjob", "elastic", "-n", namespace, "--replicas=1")
    shrunk = _scaled_to(cluster, namespace, "elastic", 1)
    assert shrunk["metadata"]["uid"] == first["metadata"]["uid"]
    done = wait_phase(cluster, namespace, "elastic", "Succeeded", "Failed", timeout=400)
    status = done["status"]
    assert status["phase"] == "Succeeded", status
    assert status["attempt"] == 1 and status["sync"]["verified"] is True, status
    assert status["elastic"]["resizes"] == 2 and status["elastic"]["lastResize"]["to"] == 1, status
    assert [job["metadata"]["uid"] for job in children(cluster, namespace, "jobs", "elastic")] == [
        first["metadata"]["uid"]
    ]
    wide = cluster.kubectl("get", "ddpj", "elastic", "-n", namespace, "-o", "wide").stdout
    assert "ELASTIC" in wide.splitlines()[0]
