"""Faults and bad input on the real control plane, the pods run as containers by the real nodes' kubelets:
the API server restarting under a running job, a hung rank, spec changes the API server refuses, a spec
whose Job Kubernetes refuses, and a hand-edited status. (A lost node: tests/e2e/test_real_nodes.py; a rank
killed in its container and a pod deleted: tests/e2e/test_kueue.py, whose restart in place under Kueue
proves both with one start-up.) Each test says how long it waited for what; none sleeps to decide."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from helpers.e2e import (
    Operator,
    children,
    ddpjob,
    get,
    real_ddpjob,
    wait_phase,
)
from helpers.e2e_pods import durable_job, pod_at, rank_process
from testcluster.fixtures import Cluster, wait_for
from testcluster.nodeconfig import RealNode

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _apply(cluster: Cluster, namespace: str, doc: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))


def _patch(cluster: Cluster, namespace: str, name: str, patch: dict[str, Any], *extra: str) -> Any:
    return cluster.kubectl(
        "patch", "ddpjob", name, "-n", namespace, "--type=merge", "-p", json.dumps(patch), *extra, check=False
    )


def test_the_api_server_restarts_under_a_running_job(
    cluster: Cluster, operator: Operator, namespace: str, tmp_path: Path, real_nodes: list[RealNode]
) -> None:
    doc = real_ddpjob(
        "outage",  # long enough to outlast the outage (about 15 s), no longer
        **durable_job(tmp_path / "ckpt", trainer={"steps": 400, "checkpointEvery": 50}),
        syncCheck={"everySteps": 50},
    )
    _apply(cluster, namespace, doc)
    wait_for(lambda: list((tmp_path / "ckpt").glob("step-*.pt")), what="a first checkpoint", timeout=240)
    before = get(cluster, namespace, "outage")["status"]
    outage = cluster.restart_apiserver(down_seconds=5)
    assert operator.process is not None and operator.process.poll() is None, "the operator exited"
    status = wait_phase(cluster, namespace, "outage", "Succeeded", "Failed", timeout=300)["status"]
    assert status["phase"] == "Succeeded", status
    assert (status["attempt"], status["restarts"]) == (1, 0), status
    assert status["startTime"] == before["startTime"], (before, status)
    assert status["sync"]["verified"] is True and status["progress"]["percent"] == 100, status
    assert [j["metadata"]["name"] for j in children(cluster, namespace, "jobs", "outage")] == ["outage-1"]
    assert [s["metadata"]["name"] for s in children(cluster, namespace, "services", "outage")] == ["outage"]
    print(f"API server down {outage:.1f} s, from step {before.get('progress', {}).get('step')} of 400")


def test_a_hung_rank_restarts_the_gang_with_a_reason_naming_it(
    cluster: Cluster, operator: Operator, namespace: str, tmp_path: Path, real_nodes: list[RealNode]
) -> None:
    folder = tmp_path / "ckpt"
    doc = real_ddpjob(  # more steps than the test waits for: it ends once the next attempt has resumed
        "hung",
        **durable_job(folder, trainer={"steps": 1000000, "checkpointEvery": 20}),
        syncCheck={"everySteps": 20},
        stallTimeoutSeconds=20,
    )
    _apply(cluster, namespace, doc)
    wait_for(lambda: list(folder.glob("step-*.pt")), what="a checkpoint", timeout=240)
    wait_for(
        lambda: get(cluster, namespace, "hung").get("status", {}).get("progress", {}).get("step"),
        what="a progress reading with a step",
        timeout=60,
        every=1,
    )
    victim = pod_at(cluster, namespace, "hung", 1)
    frozen = rank_process(real_nodes, victim)
    started = Path(f"/proc/{frozen}/stat").read_text().rsplit(")", 1)[1].split()[19]
    os.kill(frozen, signal.SIGSTOP)
    try:

        def stalled() -> dict[str, Any] | None:
            ready = {c["type"]: c for c in get(cluster, namespace, "hung")["status"]["conditions"]}["Ready"]
            return ready if ready["reason"] == "Stalled" else None

        ready = wait_for(stalled, what="the attempt to be ended as Stalled", timeout=120, every=1)
        assert victim["metadata"]["name"] in ready["message"], ready
        assert "spec.stallTimeoutSeconds" in ready["message"], ready

        def stalled_events() -> (
            list[dict[str, Any]] | None
        ):  # Kopf posts events after the status, in the back
            found: list[dict[str, Any]] = cluster.kubectl_json(
                "get",
                "events",
                "-n",
                namespace,
                "--field-selector",
                "involvedObject.name=hung,reason=Stalled",
            )["items"]
            return found or None

        events = wait_for(stalled_events, what="the Stalled event", timeout=30, every=1)
        assert victim["metadata"]["name"] in events[0]["message"], events
        print(f"hung rank: {ready['message']}")

        def resumed() -> str | None:  # the hung pod goes after its 120 s grace period, then attempt 2 starts
            pods = [
                p
                for p in children(cluster, namespace, "pods", "hung")
                if p["metadata"]["labels"]["ddpjob.io/attempt"] == "2"
                and p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "0"
                and p["status"].get("phase") == "Running"
            ]
            log = cluster.logs(namespace, pods[0]["metadata"]["name"]) if pods else ""
            return next((line for line in log.splitlines() if "restored" in line), None)

        line = wait_for(resumed, what="attempt 2 to restore a checkpoint", timeout=300, every=2)
        assert "(step 0;" not in line, line
        status = get(cluster, namespace, "hung")["status"]
        assert (status["attempt"], status["restarts"]) == (2, 1), status
    finally:  # the pod's own stop kills it after its grace period; a failed test must not leave it frozen
        with contextlib.suppress(OSError):
            if Path(f"/proc/{frozen}/stat").read_text().rsplit(")", 1)[1].split()[19] == started:
                os.kill(frozen, signal.SIGKILL)
    cluster.kubectl("delete", "ddpjob", "hung", "-n", namespace, "--wait=true", "--timeout=180s")


def test_spec_changes_that_cannot_be_honoured_are_refused_and_the_rest_apply_at_the_next_attempt(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode]
) -> None:
    script = "import os, sys, time\nif os.environ.get('STAGE') == 'two': sys.exit(0)\ntime.sleep(600)\n"
    _apply(cluster, namespace, real_ddpjob("fixed", command=["python", "-c", script], maxRestarts=2))
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


def test_a_hand_edited_status_is_repaired(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode]
) -> None:
    script = "import time; time.sleep(600)"
    _apply(cluster, namespace, real_ddpjob("edited", command=["python", "-c", script]))
    wait_phase(cluster, namespace, "edited", "Running", timeout=120)
    garbage = {
        "status": {
            "phase": "Succeeded",
            "attempt": -7,
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
