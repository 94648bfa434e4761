"""The operator, end to end on the real control plane: kubectl apply → Service + Indexed Job → pods run as
containers by the real nodes' kubelets → status from what exists. The operator authenticates as the chart's
ServiceAccount (RBAC on)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import yaml

from helpers.e2e import (
    ON_REAL_NODES,
    REPO,
    Operator,
    children,
    ddpjob,
    get,
    real_ddpjob,
    session_operator_paused,
    settle,
    wait_phase,
    writable_folder,
)
from helpers.operator_process import OPERATOR_USER, chart_rbac, install
from testcluster.audit import Request
from testcluster.fixtures import Cluster, wait_for
from testcluster.nodeconfig import RealNode

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _apply(cluster: Cluster, namespace: str, doc: dict[str, object]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))


def _python(code: str) -> dict[str, object]:
    return {"command": ["python", "-c", code]}


def test_quickstart_trains_verified_and_deletion_leaves_nothing(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode], tmp_path: Path
) -> None:
    doc = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    doc["spec"]["trainer"].update(steps=60, checkpointEvery=20)
    doc["spec"]["syncCheck"]["everySteps"] = 20
    ckpt = str(writable_folder(tmp_path / "ckpt"))  # a folder of this test's own (the claim: test_real_nodes)
    doc["spec"]["checkpoint"] = {"volume": {"hostPath": {"path": ckpt}}, "mountPath": ckpt}
    doc["spec"]["podTemplate"] = ON_REAL_NODES
    _apply(cluster, namespace, doc)
    done = wait_phase(cluster, namespace, "quickstart", "Succeeded", "Failed", timeout=300)
    status = done["status"]
    assert status["phase"] == "Succeeded", status
    assert status["sync"]["verified"] is True and status["sync"]["checks"] >= 3, status
    assert (status["attempt"], status["restarts"]) == (1, 0)
    assert {c["type"]: c["status"] for c in status["conditions"]}["Complete"] == "True"
    table = cluster.kubectl("get", "ddpj", "-n", namespace).stdout.split()
    assert table[:9] == ["NAME", "PHASE", "REASON", "NODES", "ATTEMPT", "SYNC", "PROGRESS", "ETA", "AGE"]
    assert table[9:17] == ["quickstart", "Succeeded", "Completed", "2", "1", "true", "100%", "0s"]
    events = cluster.kubectl(
        "get", "events", "-n", namespace, "--field-selector", "involvedObject.kind=DDPJob"
    ).stdout
    assert "Created" in events and "Completed" in events
    cluster.kubectl("delete", "ddpjob", "quickstart", "-n", namespace, "--wait=true", "--timeout=60s")
    for kind in ("jobs", "pods", "services"):
        wait_for(
            lambda kind=kind: not children(cluster, namespace, kind, "quickstart"),
            what=f"{kind} of the deleted DDPJob to be garbage-collected",
            timeout=60,
        )


def test_apply_refuses_what_validate_refuses(cluster: Cluster, operator: Operator, namespace: str) -> None:
    cases = [
        (ddpjob("bad-backend", backend="nccl"), ["spec.backend", 'backend "nccl" needs device "cuda"']),
        (ddpjob("bad-nodes", nodes=0), ["spec.nodes", "should be greater than or equal to 1"]),
        (ddpjob("bad-field", gpus=8), ['unknown field "spec.gpus"']),
        (ddpjob("n" * 60), ["is too long: pod hostnames"]),
        (ddpjob("bad-ports", metricsPort=29500), ["spec.metricsPort", "must differ from masterPort"]),
    ]
    for doc, fragments in cases:
        result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc), check=False)
        assert result.returncode != 0, f"the API server accepted {doc['metadata']}"
        for fragment in fragments:
            assert fragment in result.stderr, result.stderr
    assert not cluster.kubectl_json("get", "ddpjobs", "-n", namespace)["items"]


def test_explain_teaches_every_field(cluster: Cluster, operator: Operator) -> None:
    text = cluster.kubectl("explain", "ddpjob.spec.nccl").stdout
    assert "NCCL settings for device cuda" in text and "timeoutSeconds" in text
    assert "Kueue LocalQueue" in cluster.kubectl("explain", "ddpjob.spec.queueName").stdout


def test_failed_pod_restarts_the_gang(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode]
) -> None:
    fail_once = (
        "import os, sys; "
        "sys.exit(3 if (os.environ['DDPJOB_ATTEMPT'], os.environ['NODE_RANK']) == ('1', '1') else 0)"
    )
    _apply(cluster, namespace, real_ddpjob("flaky", **_python(fail_once)))
    status = wait_phase(cluster, namespace, "flaky", "Succeeded", "Failed", timeout=180)["status"]
    assert status["phase"] == "Succeeded", status
    assert (status["attempt"], status["restarts"]) == (2, 1)
    assert [job["metadata"]["name"] for job in children(cluster, namespace, "jobs", "flaky")] == ["flaky-2"]
    events = cluster.kubectl(
        "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=flaky"
    ).stdout
    assert "node 1 exited 3" in events


def test_restarts_run_out(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode]
) -> None:
    _apply(cluster, namespace, real_ddpjob("doomed", maxRestarts=1, **_python("raise SystemExit(5)")))
    status = wait_phase(cluster, namespace, "doomed", "Failed", "Succeeded", timeout=180)["status"]
    assert status["phase"] == "Failed" and (status["attempt"], status["restarts"]) == (2, 1)
    failed = {c["type"]: c for c in status["conditions"]}["Failed"]
    assert failed["reason"] == "MaxRestartsExceeded" and "exited 5" in failed["message"]


def test_divergence_fails_without_restart(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode], tmp_path: Path
) -> None:
    ckpt = str(writable_folder(tmp_path / "ckpt"))
    doc = real_ddpjob(
        "drill",
        trainer={"steps": 40, "checkpointEvery": 0},
        syncCheck={"everySteps": 5},
        env=[{"name": "DDPJOB_CHAOS_DIVERGE", "value": "rank=1,step=12"}],
        checkpoint={"volume": {"hostPath": {"path": ckpt}}, "mountPath": ckpt},
    )
    _apply(cluster, namespace, doc)
    status = wait_phase(cluster, namespace, "drill", "Failed", "Succeeded", timeout=300)["status"]
    assert status["phase"] == "Failed" and status["attempt"] == 1, status
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Failed"]["reason"] == "SyncDivergence"
    assert conditions["SyncVerified"]["status"] == "False"
    assert status["sync"]["verified"] is False and status["sync"]["mismatches"] >= 1


def test_suspend_and_resume(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode]
) -> None:
    _apply(cluster, namespace, real_ddpjob("pausable", **_python("import time; time.sleep(600)")))
    wait_phase(cluster, namespace, "pausable", "Running", timeout=120)
    cluster.kubectl(
        "patch", "ddpjob", "pausable", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )
    wait_phase(cluster, namespace, "pausable", "Suspended", timeout=60)
    wait_for(lambda: not children(cluster, namespace, "pods", "pausable"), what="pods to stop", timeout=60)
    assert len(children(cluster, namespace, "jobs", "pausable")) == 1
    cluster.kubectl(
        "patch", "ddpjob", "pausable", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":false}}'
    )
    status = wait_phase(cluster, namespace, "pausable", "Running", timeout=120)["status"]
    assert status["attempt"] == 1 and status["readyNodes"] == 2


def test_operator_restart_creates_no_duplicates(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode]
) -> None:
    _apply(cluster, namespace, real_ddpjob("steady", **_python("import time; time.sleep(600)")))
    wait_phase(cluster, namespace, "steady", "Running", timeout=120)
    assert operator.process is not None
    operator.process.send_signal(signal.SIGKILL)
    operator.process.wait()
    operator.start()
    # a window in which nothing may be created: the restarted operator (live: its /healthz answered) runs
    # its resume handler at once and its timer every 5 s (TIMER_INTERVAL_SECONDS); 8 s holds the resume,
    # the child events it watches again and at least one timer round, each of which would have made a
    # duplicate Job or Service if it did not find the running ones
    settle(8)
    jobs = children(cluster, namespace, "jobs", "steady")
    assert [job["metadata"]["name"] for job in jobs] == ["steady-1"]
    assert len(children(cluster, namespace, "services", "steady")) == 1
    assert get(cluster, namespace, "steady")["status"]["phase"] == "Running"


def test_unschedulable_job_says_why(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode]
) -> None:
    _apply(cluster, namespace, real_ddpjob("greedy", device="cuda", procsPerNode=8, **_python("pass")))

    def explained() -> dict[str, object] | None:
        status = get(cluster, namespace, "greedy").get("status", {})
        ready = {c["type"]: c for c in status.get("conditions", [])}.get("Ready", {})
        return ready if ready.get("reason") == "Unschedulable" else None

    ready = wait_for(explained, what="an Unschedulable reason", timeout=90, every=0.5)
    assert "Insufficient nvidia.com/gpu" in str(ready["message"])
    assert get(cluster, namespace, "greedy")["status"]["phase"] == "Pending"


NOWHERE = {"nodeSelector": {"ddpjob.io/test-no-such-node": "true"}}
"""A pod template no node takes: its pods stay unscheduled, so no kubelet ever says anything of them."""
NEEDS = {"envFrom": [{"secretRef": {"name": "s3-creds"}}, {"configMapRef": {"name": "settings"}}]}


def _ready(cluster: Cluster, namespace: str, name: str, reason: str) -> dict[str, object] | None:
    """The DDPJob's Ready condition once its reason is ``reason``."""
    status = get(cluster, namespace, name).get("status", {})
    ready = {c["type"]: c for c in status.get("conditions", [])}.get("Ready", {})
    return ready if ready.get("reason") == reason else None


def _secret_requests(requests: list[Request]) -> list[Request]:
    return [r for r in requests if r.resource in ("secrets", "configmaps")]


def test_by_default_the_operator_reads_no_secret_and_a_pods_waiting_reason_names_a_missing_one(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    """The chart's default (no Secret or ConfigMap RBAC, no --check-references): a DDPJob naming a missing
    Secret whose pods no node takes waits Unschedulable (nothing names the Secret before a pod reaches a
    node: what checkReferences.namespaces would add); one whose pods reach the node agents is Pending with
    ConfigError naming it, from its pods' waiting reason (the node agent's words; the real kubelet's:
    test_without_secret_rbac_the_kubelet_names_a_missing_secret_within_30_s). The API server's audit log
    holds not one request of the operator's for a Secret or a ConfigMap: none read, none refused."""
    assert "checked from the kubelet's reasons only" in operator.log.read_text()  # said once, at start
    mark = cluster.audit.mark()
    _apply(cluster, namespace, ddpjob("queued", podTemplate=NOWHERE, **NEEDS))
    _apply(cluster, namespace, ddpjob("placed", **NEEDS))
    # the reason only: the process-tier node agent's message did not reach the status in this test (cause
    # not found yet); the real kubelet's naming of the Secret is proven on the real nodes (test below)
    wait_for(
        lambda: _ready(cluster, namespace, "placed", "ConfigError"), what="Ready: ConfigError", timeout=30
    )
    wait_for(
        lambda: _ready(cluster, namespace, "queued", "Unschedulable"), what="Ready: Unschedulable", timeout=30
    )
    status = get(cluster, namespace, "placed")["status"]
    assert (status["phase"], status["attempt"], status.get("restarts", 0)) == ("Pending", 1, 0), status
    requests = cluster.audit.requests(since=mark, user=OPERATOR_USER)
    assert [r for r in requests if r.kind == "ddpjobs/status" and r.namespace == namespace], (
        "no status write of the operator's in the audit log: the wrong log, or the wrong user"
    )
    assert not _secret_requests(requests), _secret_requests(requests)


def test_with_check_references_a_missing_secret_is_said_before_any_pod_reaches_a_node(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """The opt-in (the chart's checkReferences.namespaces: a Role in this namespace, --check-references):
    pods that no node takes, so no kubelet ever says anything, and an envFrom Secret and ConfigMap that do
    not exist. The status names them and their fields within 30 s, the Job is created all the same, no
    restart is spent; once they exist, the remaining cause (Unschedulable) is said instead. The operator
    only got single Secrets and ConfigMaps, in this namespace only."""
    grant = [
        o
        for o in chart_rbac("--set", f"checkReferences.namespaces={{{namespace}}}")
        if o["kind"] in ("Role", "RoleBinding") and o["metadata"]["name"].endswith("-references")
    ]
    assert {(o["kind"], o["metadata"]["namespace"]) for o in grant} == {
        ("Role", namespace),
        ("RoleBinding", namespace),
    }
    with session_operator_paused():
        kubeconfig = install(cluster)
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(grant))
        running = Operator(kubeconfig, tmp_path / "operator.log", args=(f"--check-references={namespace}",))
        mark = cluster.audit.mark()
        running.start()
        try:
            assert f"looked up (their metadata only) in namespaces {namespace}" in running.log.read_text()
            _apply(cluster, namespace, ddpjob("unsaid", podTemplate=NOWHERE, **NEEDS))
            ready = wait_for(
                lambda: _ready(cluster, namespace, "unsaid", "ConfigError"),
                what="Ready: ConfigError",
                timeout=30,
            )
            said = (
                "Secret s3-creds (spec.envFrom[0].secretRef), "
                "ConfigMap settings (spec.envFrom[1].configMapRef)"
            )
            assert f"{said} do not exist in namespace {namespace}" in str(ready["message"]), ready
            assert children(cluster, namespace, "jobs", "unsaid"), (
                "the Job was not created while the Secret is missing"
            )
            assert all(not p["spec"].get("nodeName") for p in children(cluster, namespace, "pods", "unsaid"))
            cluster.kubectl("create", "secret", "generic", "s3-creds", "-n", namespace, "--from-literal=k=v")
            cluster.kubectl("create", "configmap", "settings", "-n", namespace, "--from-literal=k=v")
            wait_for(
                lambda: _ready(cluster, namespace, "unsaid", "Unschedulable"),
                what="Ready: Unschedulable",
                timeout=30,
            )
            status = get(cluster, namespace, "unsaid")["status"]
            assert (status["phase"], status["attempt"], status.get("restarts", 0)) == ("Pending", 1, 0), (
                status
            )
        finally:
            running.stop()
    read = _secret_requests(cluster.audit.requests(since=mark, user=OPERATOR_USER))
    assert {(r.resource, r.verb, r.namespace, r.name) for r in read} == {
        ("secrets", "get", namespace, "s3-creds"),
        ("configmaps", "get", namespace, "settings"),
    }, read
    assert {r.code for r in read} <= {200, 404} and 404 in {r.code for r in read}, read


def test_without_secret_rbac_the_kubelet_names_a_missing_secret_within_30_s(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode]
) -> None:
    """On the real nodes, with the chart's default (no Secret RBAC, no look-up): a DDPJob whose envFrom
    names a missing Secret says so in its status within 30 s, from the kubelet's waiting reason
    (CreateContainerConfigError: secret "s3-creds" not found), with the field that names it; no restart is
    spent, and once the Secret exists the pods start and the job succeeds. The operator asked for no
    Secret."""
    mark = cluster.audit.mark()
    doc = real_ddpjob("unsaid", envFrom=[{"secretRef": {"name": "s3-creds"}}], **_python("pass"))
    _apply(cluster, namespace, doc)
    ready = wait_for(
        lambda: _ready(cluster, namespace, "unsaid", "ConfigError"), what="Ready: ConfigError", timeout=30
    )
    message = str(ready["message"])
    assert 'CreateContainerConfigError: secret "s3-creds" not found' in message, ready
    assert "it will not fix itself: create Secret s3-creds (spec.envFrom[0].secretRef)" in message, ready
    cluster.kubectl("create", "secret", "generic", "s3-creds", "-n", namespace, "--from-literal=k=v")
    status = wait_phase(cluster, namespace, "unsaid", "Succeeded", "Failed", timeout=120)["status"]
    assert (status["phase"], status["attempt"], status.get("restarts", 0)) == ("Succeeded", 1, 0), status
    read = _secret_requests(cluster.audit.requests(since=mark, user=OPERATOR_USER))
    assert not read, read


def test_operator_metrics(cluster: Cluster, operator: Operator) -> None:
    text = operator.metrics()
    assert 'ddpjob_reconciles_total{result="ok"}' in text
    assert "ddpjob_reconcile_duration_seconds_count" in text


def test_the_operator_started_itself_again_on_glibcs_heap(cluster: Cluster, operator: Operator) -> None:
    """ddp_operator.runtime.heap.ALLOCATOR_ENV is in the running operator's environment (the interpreter
    reads it
    at start only), and the log says why."""
    from ddp_operator.runtime.heap import ALLOCATOR_ENV

    assert operator.process is not None
    environ = Path(f"/proc/{operator.process.pid}/environ").read_bytes().split(b"\0")
    for key, value in ALLOCATOR_ENV.items():
        assert f"{key}={value}".encode() in environ
    assert (
        "ddpjob operator: starting again with PYTHONMALLOC=malloc MALLOC_ARENA_MAX=2,"
        in operator.log.read_text()
    )


def test_deadline_and_ttl(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode]
) -> None:
    _apply(
        cluster,
        namespace,
        real_ddpjob("slowpoke", activeDeadlineSeconds=3, **_python("import time; time.sleep(600)")),
    )
    status = wait_phase(cluster, namespace, "slowpoke", "Failed", timeout=90)["status"]
    assert {c["type"]: c for c in status["conditions"]}["Failed"]["reason"] == "DeadlineExceeded"
    wait_for(
        lambda: not children(cluster, namespace, "pods", "slowpoke"), what="the pods to stop", timeout=60
    )
    _apply(cluster, namespace, real_ddpjob("ephemeral", ttlSecondsAfterFinished=2, **_python("pass")))
    wait_for(
        lambda: (
            not cluster.kubectl_json(
                "get", "ddpjobs", "-n", namespace, "--field-selector", "metadata.name=ephemeral"
            )["items"]
        ),
        what="the finished DDPJob to be deleted after its TTL",
        timeout=90,
        every=0.5,
    )


def test_structured_logs(cluster: Cluster, operator: Operator, tmp_path: Path) -> None:
    """--json-logs: one JSON object a line, ready for a log pipeline."""
    import os
    import subprocess
    import sys

    log = tmp_path / "json.log"

    def configured() -> bool:
        """Whether a complete line of the log is the startup activity's (Kopf's "Activity 'configure'
        succeeded"), the last record the assertions below read, or the operator has exited."""
        for line in log.read_text().splitlines():
            try:
                if "configure" in json.loads(line).get("message", ""):
                    return True
            except ValueError:  # a line being written
                continue
        return process.poll() is not None

    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ddp_operator",
                "operator",
                "--json-logs",
                "--standalone",
                "--liveness=127.0.0.1:0",
                "--metrics-port=0",
            ],
            env={**os.environ, "KUBECONFIG": str(operator.kubeconfig)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        wait_for(configured, what=f"the operator's startup activity (configure) in {log}", timeout=120)
        process.terminate()
        process.wait(timeout=30)
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert lines, "the operator logged nothing"
    records = [json.loads(line) for line in lines]
    assert all("message" in record for record in records)
    assert records[0]["message"].startswith("ddpjob operator: starting again with PYTHONMALLOC=malloc")
    assert any("configure" in record["message"] for record in records)
