"""The test cluster is a real Kubernetes: kubectl, RBAC, DNS, Jobs, garbage collection, process lifecycle."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cluster_pod_scripts import SERVER

from testcluster.fixtures import Cluster, manifests, python_pod, wait_for
from testcluster.layout import NODE_NAMES

pytestmark = pytest.mark.cluster

VERSIONS = Path(__file__).parents[2] / "hack" / "cluster" / "versions.env"
K8S_VERSION = next(
    line.split("=", 1)[1] for line in VERSIONS.read_text().splitlines() if line.startswith("K8S_VERSION=")
)


CLIENT = """
import os, socket, time
for attempt in range(300):
    try:
        with socket.create_connection(("a-host.svc", 8080), timeout=2) as c:
            reply = c.recv(100).decode()
        break
    except OSError as e:
        time.sleep(0.2)
else:
    raise SystemExit("never reached a-host.svc")
print(reply, flush=True)
with open(os.environ["DDPJOB_TERMINATION_LOG"], "w") as f:
    f.write("got: " + reply)
"""


def phase(cluster: Cluster, namespace: str, name: str) -> str:
    return str(cluster.pod(namespace, name).get("status", {}).get("phase"))


def test_server_is_the_pinned_kubernetes_release(cluster: Cluster) -> None:
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]
    assert version["gitVersion"] == K8S_VERSION
    assert version["major"] == "1" and version["minor"] == K8S_VERSION.split(".")[1]


def test_nodes_are_ready_with_gpu_capacity(cluster: Cluster) -> None:
    cluster.kubectl("wait", "--for=condition=Ready", "node", "--all", "--timeout=60s")
    nodes = {n["metadata"]["name"]: n for n in cluster.kubectl_json("get", "nodes")["items"]}
    assert set(NODE_NAMES) <= set(nodes)
    for name in NODE_NAMES:
        assert nodes[name]["status"]["capacity"]["nvidia.com/gpu"] == "4"
        assert nodes[name]["status"]["allocatable"]["cpu"] == "8"
    lease = cluster.kubectl_json("get", "lease", "-n", "kube-node-lease", NODE_NAMES[0])
    assert lease["spec"]["holderIdentity"] == NODE_NAMES[0]


def test_pod_reaches_pod_by_dns_name_over_tcp(cluster: Cluster, namespace: str) -> None:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "svc"},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"app": "dns"},
            "ports": [{"name": "tcp", "port": 8080}],
        },
    }
    server = python_pod("a", SERVER, labels={"app": "dns"}, hostname="a-host", subdomain="svc")
    client = python_pod("b", CLIENT, affinity=_other_node_than("dns"))
    cluster.kubectl(
        "apply", "--server-side", "-n", namespace, "-f", "-", input=manifests(service, server, client)
    )
    for pod in ("a", "b"):
        cluster.kubectl(
            "wait",
            "-n",
            namespace,
            f"pod/{pod}",
            "--for=jsonpath={.status.phase}=Succeeded",
            "--timeout=120s",
        )
    a, b = cluster.pod(namespace, "a"), cluster.pod(namespace, "b")
    assert a["spec"]["nodeName"] != b["spec"]["nodeName"]
    expected = f"hello from a-host to {b['status']['podIP']}"
    assert cluster.logs(namespace, "b").strip() == expected
    terminated = b["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"
    assert terminated["message"] == f"got: {expected}"


def test_pod_name_resolves_only_once_the_service_publishes_it(cluster: Cluster, namespace: str) -> None:
    probe = """
import socket, sys, time
seen_missing = False
while True:
    try:
        print("resolved", socket.gethostbyname("a-host.late"), flush=True)
        break
    except socket.gaierror:
        if not seen_missing:
            print("unresolved", flush=True)
        seen_missing = True
        time.sleep(0.2)
sys.exit(0 if seen_missing else 3)
"""
    target = python_pod(
        "a", "import time; time.sleep(120)", labels={"app": "late"}, hostname="a-host", subdomain="late"
    )
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifests(target, python_pod("probe", probe)))
    wait_for(lambda: "unresolved" in cluster.logs(namespace, "probe"), what="the probe to fail to resolve")
    target_ip = wait_for(lambda: cluster.pod(namespace, "a")["status"].get("podIP"), what="pod a's IP")
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "late"},
        "spec": {"clusterIP": "None", "selector": {"app": "late"}, "ports": [{"port": 80}]},
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(service))
    cluster.kubectl(
        "wait", "-n", namespace, "pod/probe", "--for=jsonpath={.status.phase}=Succeeded", "--timeout=60s"
    )
    assert cluster.logs(namespace, "probe").split() == ["unresolved", "resolved", target_ip]


INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def test_indexed_job_runs_to_completion_with_its_index(cluster: Cluster, namespace: str) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "idx"},
        "spec": {
            "completionMode": "Indexed",
            "completions": 2,
            "parallelism": 2,
            "backoffLimit": 0,
            "template": python_pod(
                "x",
                "import os; print('rank', os.environ['RANK'], os.environ['ME'])",
                env=[
                    {
                        "name": "RANK",
                        "valueFrom": {"fieldRef": {"fieldPath": INDEX}},
                    },
                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "ME", "value": "$(POD)@$(RANK)"},
                ],
            ),
        },
    }
    del job["spec"]["template"]["apiVersion"], job["spec"]["template"]["kind"]
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job))
    cluster.kubectl("wait", "-n", namespace, "job/idx", "--for=condition=Complete", "--timeout=120s")
    pods = cluster.kubectl_json("get", "pods", "-n", namespace, "-l", "job-name=idx")["items"]
    lines = sorted(cluster.logs(namespace, p["metadata"]["name"]).strip() for p in pods)
    names = {
        p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p["metadata"]["name"]
        for p in pods
    }
    assert lines == [f"rank 0 {names['0']}@0", f"rank 1 {names['1']}@1"]


def test_failed_container_reports_exit_code_and_message(cluster: Cluster, namespace: str) -> None:
    code = "import os; open(os.environ['DDPJOB_TERMINATION_LOG'], 'w').write('diverged at step 7'); exit(3)"
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(python_pod("fail", code)))
    cluster.kubectl(
        "wait", "-n", namespace, "pod/fail", "--for=jsonpath={.status.phase}=Failed", "--timeout=60s"
    )
    state = cluster.pod(namespace, "fail")["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (state["exitCode"], state["reason"], state["message"]) == (3, "Error", "diverged at step 7")


def test_deleting_a_namespace_takes_its_pods_and_processes(cluster: Cluster) -> None:
    namespace = cluster.create_namespace("doomed")
    sleeper = python_pod("sleeper", "import time; time.sleep(600)", grace=3)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(sleeper))
    cluster.kubectl("wait", "-n", namespace, "pod/sleeper", "--for=condition=Ready", "--timeout=60s")
    container_id = cluster.pod(namespace, "sleeper")["status"]["containerStatuses"][0]["containerID"]
    pid = int(container_id.rsplit("/", 1)[1])
    assert Path(f"/proc/{pid}").exists()
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    cluster.kubectl("wait", "--for=delete", f"namespace/{namespace}", "--timeout=120s")
    assert not _alive(pid), f"pod process {pid} survived its namespace"


def test_rbac_is_enforced_for_service_accounts(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("create", "serviceaccount", "-n", namespace, "robot")
    as_robot = cluster.serviceaccount_kubeconfig(namespace, "robot")
    can = ["auth", "can-i", "list", "pods", "-n", namespace]
    assert cluster.kubectl(*can, kubeconfig=as_robot, check=False).stdout.strip() == "no"
    cluster.kubectl("create", "role", "-n", namespace, "pod-reader", "--verb=list", "--resource=pods")
    cluster.kubectl(
        "create",
        "rolebinding",
        "-n",
        namespace,
        "robot-reads",
        "--role=pod-reader",
        f"--serviceaccount={namespace}:robot",
    )
    assert cluster.kubectl(*can, kubeconfig=as_robot).stdout.strip() == "yes"
    whoami = json.loads(cluster.kubectl("auth", "whoami", "-o", "json", kubeconfig=as_robot).stdout)
    assert whoami["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:robot"


def test_kubectl_explain_and_server_side_field_validation(cluster: Cluster, namespace: str) -> None:
    assert "subdomain" in cluster.kubectl("explain", "pod.spec.subdomain").stdout
    bad = python_pod("bad", "pass")
    bad["spec"]["containers"][0]["commandd"] = ["typo"]
    result = cluster.kubectl(
        "apply", "-n", namespace, "--validate=strict", "-f", "-", input=json.dumps(bad), check=False
    )
    assert result.returncode != 0 and 'unknown field "spec.containers[0].commandd"' in result.stderr


def _other_node_than(app: str) -> dict[str, object]:
    """Required anti-affinity to ``app=<app>`` pods on kubernetes.io/hostname: the two pods get two Nodes."""
    term = {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": "kubernetes.io/hostname"}
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_active_deadline_fails_the_pod(cluster: Cluster, namespace: str) -> None:
    pod = python_pod("slow", "import time; time.sleep(600)", activeDeadlineSeconds=2)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))
    cluster.kubectl(
        "wait", "-n", namespace, "pod/slow", "--for=jsonpath={.status.phase}=Failed", "--timeout=60s"
    )
    assert cluster.pod(namespace, "slow")["status"]["reason"] == "DeadlineExceeded"


def test_on_failure_restarts_the_container(cluster: Cluster, namespace: str) -> None:
    second_try_passes = (
        "import os; seen = os.path.exists('marker'); open('marker', 'w'); exit(0 if seen else 1)"
    )
    pod = python_pod("flaky", second_try_passes, restart="OnFailure")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))
    cluster.kubectl(
        "wait", "-n", namespace, "pod/flaky", "--for=jsonpath={.status.phase}=Succeeded", "--timeout=60s"
    )
    status = cluster.pod(namespace, "flaky")["status"]["containerStatuses"][0]
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 1
