"""The newcomer's path on the real control plane: configuration errors fail at once, the operator without
its peering object says so, and what the CRD cannot refuse the API server's verdict proves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.fixtures import Cluster, wait_for

from .conftest import Operator, children, ddpjob, wait_phase

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _apply(cluster: Cluster, namespace: str, doc: dict[str, object]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))


def test_a_usage_error_fails_at_once_without_restarts(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    """Exit code 2 can never succeed: the Job's podFailurePolicy fails it, and the DDPJob does not restart."""
    doc = ddpjob("usage", maxRestarts=3, command=["python", "-c", "raise SystemExit(2)"])
    _apply(cluster, namespace, doc)
    status = wait_phase(cluster, namespace, "usage", "Failed", "Succeeded", timeout=180)["status"]
    assert status["phase"] == "Failed" and status["attempt"] == 1, status
    failed = {c["type"]: c for c in status["conditions"]}["Failed"]
    assert failed["reason"] == "UsageError" and "exit code 2 is a usage error" in failed["message"], failed
    (job,) = children(cluster, namespace, "jobs", "usage")
    reasons = [c.get("reason") for c in job.get("status", {}).get("conditions", []) if c["type"] == "Failed"]
    assert reasons == ["PodFailurePolicy"], job.get("status")


def test_the_operator_without_its_peering_object_runs_standalone_and_says_so(
    cluster: Cluster, operator: Operator, namespace: str, tmp_path: Path
) -> None:
    """By hand, next to manifests/crd.yaml only: no KopfPeering in the namespace, so no silent wait."""
    log = tmp_path / "operator.log"
    command = [sys.executable, "-m", "ddp_operator", "operator", f"--namespace={namespace}"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, "--liveness=127.0.0.1:0", "--metrics-port=0"],
            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(
            lambda: "running standalone" in log.read_text(),
            what="the operator to say it runs standalone without its KopfPeering",
            timeout=60,
        )
        assert process.poll() is None, log.read_text()
        assert f"no KopfPeering {namespace}/ddpjob-operator in the cluster" in log.read_text()
    finally:
        process.terminate()
        process.wait(timeout=30)
