"""The newcomer's path on the real control plane: configuration errors fail at once, the operator run by
hand without a Lease says so, and what the CRD cannot refuse the API server's verdict proves."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ddp_operator.api import spec
from ddp_operator.children import render
from helpers.e2e import Operator, children, ddpjob, real_ddpjob, wait_phase
from helpers.spec_docs import VOLUME, doc_with
from testcluster.fixtures import Cluster, wait_for
from testcluster.nodeconfig import RealNode

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


PYTHON_OK = {"command": ["python", "-c", "print('ok')"]}


def _apply(cluster: Cluster, namespace: str, doc: dict[str, object]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))


def test_a_usage_error_fails_at_once_without_restarts(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode]
) -> None:
    """Exit code 2 can never succeed: the Job's podFailurePolicy fails it, and the DDPJob does not restart."""
    doc = real_ddpjob("usage", maxRestarts=3, command=["python", "-c", "raise SystemExit(2)"])
    _apply(cluster, namespace, doc)
    status = wait_phase(cluster, namespace, "usage", "Failed", "Succeeded", timeout=180)["status"]
    assert status["phase"] == "Failed" and status["attempt"] == 1, status
    failed = {c["type"]: c for c in status["conditions"]}["Failed"]
    assert failed["reason"] == "UsageError" and "exit code 2 is a usage error" in failed["message"], failed

    def job_failed() -> list[str] | None:
        """The Job's own verdict: FailureTarget at once, Failed once its pods are gone (Kubernetes 1.31+)."""
        (job,) = children(cluster, namespace, "jobs", "usage")
        conditions = job.get("status", {}).get("conditions", [])
        return [c.get("reason") for c in conditions if c["type"] == "Failed"] or None

    reasons = wait_for(job_failed, what="the Job's Failed condition", timeout=60)
    assert reasons == ["PodFailurePolicy"], reasons


def test_the_operator_by_hand_without_a_lease_acts_at_once_and_says_so(
    cluster: Cluster, operator: Operator, namespace: str, tmp_path: Path
) -> None:
    """By hand, next to manifests/crd.yaml only, without --lease: it acts, and says nothing stops a second
    operator from acting beside it (the chart passes --lease)."""
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
            lambda: "no --lease: acting at once" in log.read_text(),
            what="the operator to say it acts without a Lease",
            timeout=60,
        )
        assert process.poll() is None, log.read_text()
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (
            {"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}},
            "must be less than or equal",
        ),
        ({"resources": {"requests": {"nvidia.com/gpu": 1}}}, "Limit must be set for non overcommitable"),
        ({"podTemplate": {"labels": {"team name": "a"}}}, "team name"),
        ({"podTemplate": {"labels": {"team": "a b"}}}, "a b"),
        (
            {"podTemplate": {"volumes": [VOLUME], "volumeMounts": [{"name": "dta", "mountPath": "/d"}]}},
            "dta",
        ),
        (
            {"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
            "valueFrom",
        ),
    ],
    ids=[
        "request-above-limit",
        "gpu-request-on-cpu",
        "label-key",
        "label-value",
        "mount",
        "env-value-and-from",
    ],
)
def test_what_validate_refuses_the_api_server_refuses(
    cluster: Cluster, operator: Operator, namespace: str, fields: dict[str, Any], words: str
) -> None:
    """Each refusal of `ddpjob validate` matches the real API server's: the Job rendered without the offline
    checks is refused at creation (dry run) for the same key and value."""
    doc = doc_with(**copy.deepcopy(fields))
    with pytest.raises(spec.SpecError):
        spec.parse(doc)
    parsed = dataclasses.replace(spec.parse(doc, admitted=True), namespace=namespace)
    job = json.dumps(render.render_job(parsed, 1))
    refused = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=job, check=False)
    assert refused.returncode != 0 and words in refused.stderr, refused.stderr


def test_a_spec_the_crd_accepts_but_the_server_refuses_fails_at_once_creating_nothing(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    resources = {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}
    _apply(cluster, namespace, ddpjob("greedy", resources=resources, **PYTHON_OK))
    status = wait_phase(cluster, namespace, "greedy", "Failed", "Succeeded", timeout=120)["status"]
    failed = {c["type"]: c for c in status["conditions"]}["Failed"]
    assert failed["reason"] == "InvalidSpec", failed
    assert "the API server refuses the Job greedy-1" in failed["message"], failed
    assert "must be less than or equal to cpu limit" in failed["message"], failed
    for kind in ("jobs", "services", "pods"):
        assert children(cluster, namespace, kind, "greedy") == [], kind


def test_the_crd_names_the_key_the_api_server_refuses(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    doc = ddpjob("labels", podTemplate={"labels": {"ddpjob.io/attempt": "9"}})
    refused = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc), check=False)
    assert refused.returncode != 0 and 'label key "ddpjob.io/attempt" is reserved' in refused.stderr, refused


POD_SETTINGS: dict[str, Any] = {
    "imagePullSecrets": [{"name": "registry"}],
    "runtimeClassName": "nvidia",
    "securityContext": {"fsGroup": 2000, "runAsUser": 1001},
    "containerSecurityContext": {"capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}},
    "hostNetwork": True,
    "initContainers": [
        {"name": "fetch", "image": "busybox", "command": ["true"]},
        {"name": "logs", "image": "busybox", "command": ["sleep", "inf"], "restartPolicy": "Always"},
    ],
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"ddpjob.io/job-name": "demo"}},
        }
    ],
}


def test_a_pod_with_every_cluster_setting_is_accepted(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    """The settings real GPU clusters need, rendered into one Job, pass the real API server's validation
    (a dry run: the RuntimeClass and Secret need not exist), and so does the DDPJob that asks for them."""
    doc = doc_with(
        podTemplate=POD_SETTINGS,
        envFrom=[{"configMapRef": {"name": "settings"}}, {"secretRef": {"name": "tokens", "optional": True}}],
        resources={"limits": {"rdma/hca": 1}},
    )
    parsed = dataclasses.replace(spec.parse(doc), namespace=namespace)
    job = render.render_job(parsed, 1)
    pod = job["spec"]["template"]["spec"]
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet" and pod["containers"][0]["resources"]["limits"]
    accepted = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(job))
    stored = json.loads(accepted.stdout)["spec"]["template"]["spec"]
    assert stored["initContainers"][1]["restartPolicy"] == "Always" and stored["hostNetwork"] is True
    applied = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(doc), check=False
    )
    assert applied.returncode == 0, applied.stderr


def test_a_plain_python_script_finds_its_rank(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode]
) -> None:
    """procsPerNode 1, no torchrun: init_process_group() reads RANK, WORLD_SIZE and MASTER_* from the pod."""
    script = (
        "import os, torch, torch.distributed as dist; dist.init_process_group('gloo'); "
        "t = torch.ones(1); dist.all_reduce(t); assert t.item() == dist.get_world_size() == 2; "
        "assert os.environ['LOCAL_RANK'] == '0'; dist.destroy_process_group()"
    )
    _apply(cluster, namespace, real_ddpjob("plain", command=["python", "-c", script], maxRestarts=0))
    status = wait_phase(cluster, namespace, "plain", "Succeeded", "Failed", timeout=240)["status"]
    assert status["phase"] == "Succeeded", status
