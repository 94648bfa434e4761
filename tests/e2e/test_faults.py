"""Faults and bad input on the real control plane: the API server restarting under a running job, a node
lost mid-run, spec changes the API server refuses, a spec whose Job Kubernetes refuses, and a hand-edited
status. Each test says how long it waited for what; none sleeps to decide."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cluster.fixtures import Cluster, wait_for

from .conftest import Operator, children, ddpjob, get, wait_phase

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _apply(cluster: Cluster, namespace: str, doc: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))


def _patch(cluster: Cluster, namespace: str, name: str, patch: dict[str, Any], *extra: str) -> Any:
    return cluster.kubectl(
        "patch", "ddpjob", name, "-n", namespace, "--type=merge", "-p", json.dumps(patch), *extra, check=False
    )


def _durable(folder: Path, **spec: Any) -> dict[str, Any]:
    """A built-in trainer job whose checkpoints go to ``folder`` (pods are host processes here)."""
    return {"checkpoint": {"volume": {"hostPath": {"path": str(folder)}}, "mountPath": str(folder)}, **spec}


def _reached_step(cluster: Cluster, namespace: str, name: str, step: int) -> dict[str, Any] | None:
    status: dict[str, Any] = get(cluster, namespace, name).get("status", {})
    return status if status.get("progress", {}).get("step", 0) >= step else None


def test_the_api_server_restarts_under_a_running_job(
    cluster: Cluster, operator: Operator, namespace: str, tmp_path: Path
) -> None:
    doc = ddpjob(
        "outage",
        **_durable(tmp_path / "ckpt", trainer={"steps": 3000, "checkpointEvery": 500}),
        syncCheck={"everySteps": 500},
    )
    _apply(cluster, namespace, doc)
    before = wait_for(
        lambda: _reached_step(cluster, namespace, "outage", 1),
        what="the job to report progress",
        timeout=180,
        every=1,
    )
    outage = cluster.restart_apiserver(down_seconds=5)
    assert operator.process is not None and operator.process.poll() is None, "the operator exited"
    status = wait_phase(cluster, namespace, "outage", "Succeeded", "Failed", timeout=300)["status"]
    assert status["phase"] == "Succeeded", status
    assert (status["attempt"], status["restarts"]) == (1, 0), status
    assert status["startTime"] == before["startTime"], (before, status)
    assert status["sync"]["verified"] is True and status["progress"]["percent"] == 100, status
    assert [j["metadata"]["name"] for j in children(cluster, namespace, "jobs", "outage")] == ["outage-1"]
    assert [s["metadata"]["name"] for s in children(cluster, namespace, "services", "outage")] == ["outage"]
    print(f"API server down {outage:.1f} s at step {before['progress']['step']} of 3000")


def test_spec_changes_that_cannot_be_honoured_are_refused_and_the_rest_apply_at_the_next_attempt(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    script = "import os, sys, time\nif os.environ.get('STAGE') == 'two': sys.exit(0)\ntime.sleep(600)\n"
    _apply(cluster, namespace, ddpjob("fixed", command=["python", "-c", script], maxRestarts=2))
    wait_phase(cluster, namespace, "fixed", "Running", timeout=120)
    refused = {
        "nodes": ({"spec": {"nodes": 3}}, "cannot change after creation"),
        "device": ({"spec": {"device": "cuda"}}, "from cpu to cuda"),
        "trainer.learningRate": ({"spec": {"trainer": {"learningRate": 0.5}}}, "SettingsChanged"),
        "trainer.model": ({"spec": {"trainer": {"model": "pkg.mod:make"}}}, "from mlp to pkg.mod:make"),
    }
    for field, (patch, said) in refused.items():
        result = _patch(cluster, namespace, "fixed", patch)
        assert result.returncode != 0, f"spec.{field} changed on a running DDPJob"
        assert f"spec.{field}" in result.stderr and said in result.stderr, result.stderr
        assert "delete the DDPJob and apply it again" in result.stderr, result.stderr
    # What can be honoured is accepted, and waits for the next attempt: the running Job is not touched.
    accepted = _patch(cluster, namespace, "fixed", {"spec": {"env": [{"name": "STAGE", "value": "two"}]}})
    assert accepted.returncode == 0, accepted.stderr
    (job,) = children(cluster, namespace, "jobs", "fixed")
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert "STAGE" not in {e["name"] for e in env}, env
    victim = children(cluster, namespace, "pods", "fixed")[0]["metadata"]["name"]
    cluster.kubectl("delete", "pod", victim, "-n", namespace, "--wait=false")
    status = wait_phase(cluster, namespace, "fixed", "Succeeded", "Failed", timeout=240)["status"]
    assert status["phase"] == "Succeeded" and status["attempt"] == 2, status
    (job,) = children(cluster, namespace, "jobs", "fixed")
    assert {"name": "STAGE", "value": "two"} in job["spec"]["template"]["spec"]["containers"][0]["env"]


def test_a_spec_whose_job_kubernetes_refuses_fails_at_once_and_leaves_nothing(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    # The DDPJob schema lets any string through as a label value; Kubernetes does not.
    doc = ddpjob("refused", podTemplate={"labels": {"team": "a b"}})
    _apply(cluster, namespace, doc)
    status = wait_phase(cluster, namespace, "refused", "Failed", "Succeeded", timeout=60)["status"]
    failed = {c["type"]: c for c in status["conditions"]}["Failed"]
    assert failed["reason"] == "InvalidSpec", status
    assert "the API server refuses the Job" in failed["message"] and "a b" in failed["message"], failed
    for kind in ("jobs", "services", "pods", "persistentvolumeclaims"):
        assert not children(cluster, namespace, kind, "refused"), f"the refused DDPJob left {kind}"


def test_a_hand_edited_status_is_repaired(cluster: Cluster, operator: Operator, namespace: str) -> None:
    script = "import time; time.sleep(600)"
    _apply(cluster, namespace, ddpjob("edited", command=["python", "-c", script]))
    wait_phase(cluster, namespace, "edited", "Running", timeout=120)
    garbage = {
        "status": {
            "phase": "Succeeded",
            "attempt": 7,
            "restarts": -4,
            "readyNodes": 99,
            "preemptions": -2,
            "conditions": [{"type": "Bogus", "status": "True"}],
            "progress": {"step": -3, "unreachable": ["nobody"]},
            "lastReport": {"attempt": 7, "result": "Nonsense"},
        }
    }
    result = _patch(cluster, namespace, "edited", garbage, "--subresource=status")
    assert result.returncode == 0, result.stderr

    def repaired() -> dict[str, Any] | None:
        status: dict[str, Any] = get(cluster, namespace, "edited").get("status", {})
        ok = (status.get("phase"), status.get("attempt"), status.get("restarts")) == ("Running", 1, 0)
        return status if ok and status.get("readyNodes") == 2 else None

    status = wait_for(repaired, what="the operator to repair the hand-edited status", timeout=60, every=1)
    assert [j["metadata"]["name"] for j in children(cluster, namespace, "jobs", "edited")] == ["edited-1"]
    assert operator.process is not None and operator.process.poll() is None, "the operator exited"
    assert "Bogus" not in {c["type"] for c in status["conditions"]}, status
    cluster.kubectl("delete", "ddpjob", "edited", "-n", namespace, "--wait=true", "--timeout=60s")
