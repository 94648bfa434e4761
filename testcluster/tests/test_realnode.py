"""Real nodes (a kubelet and containerd per Node, :mod:`realnode`) run ``make images``' trainer image for
real: as uid 1000 in its own PID namespace (checked from the host), with the kubelet's termination message,
``kubectl logs`` and ``kubectl exec``, and pods on the two nodes reach each other by the headless Service's
DNS name. Skipped, saying why, without containerd/runc/CNI plugins, without ``make images``' archives for
the current inputs, or where the images would not fit on the disk.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from cluster_pod_scripts import SERVER

from testcluster import nodeimages, realfixture
from testcluster.fixtures import Cluster, manifests, wait_for
from testcluster.nodeconfig import RealNode

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TRAINER = realfixture.IMAGES["trainer"].removeprefix("docker.io/")

HOLD = """
import os, time
print(f"uid {os.getuid()} pid {os.getpid()}", flush=True)
with open("/dev/termination-log", "w") as f:
    f.write("finished as asked")
while not os.path.exists("/tmp/finish"):
    time.sleep(0.1)
raise SystemExit(3)
"""

CLIENT = """
import socket, time
for attempt in range(300):
    try:
        with socket.create_connection(("a-host.svc", 8080), timeout=2) as c:
            reply = c.recv(100).decode()
        break
    except OSError:
        time.sleep(0.2)
else:
    raise SystemExit("never reached a-host.svc")
with open("/dev/termination-log", "w") as f:
    f.write("got: " + reply)
"""


def pod(name: str, node: str, code: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": spec.pop("labels", {})},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "main",
                    "image": TRAINER,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python", "-c", code],
                }
            ],
            **realfixture.on_node(node),
            **spec,
        },
    }


def container_status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    statuses = cluster.pod(namespace, name).get("status", {}).get("containerStatuses") or [{}]
    return dict(statuses[0])


def test_trainer_image_runs_as_uid_1000_in_its_own_pid_namespace(
    cluster: Cluster, namespace: str, real_nodes: list[RealNode]
) -> None:
    node = real_nodes[0]
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifests(pod("hold", node.name, HOLD)))
    running = wait_for(
        lambda: (
            container_status(cluster, namespace, "hold").get("state", {}).get("running")
            and container_status(cluster, namespace, "hold")
        ),
        what="the trainer container to run",
        timeout=180,
    )
    status = (pid := realfixture.host_pid(node, running["containerID"])) and Path(
        f"/proc/{pid}/status"
    ).read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines())
    assert fields["Uid"].split() == ["1000"] * 4, fields["Uid"]
    assert fields["NSpid"].split() == [str(pid), "1"], fields["NSpid"]  # PID 1 of a namespace of its own
    assert Path(f"/proc/{pid}/ns/pid").readlink() != Path("/proc/self/ns/pid").readlink()  # not the host's
    assert cluster.pod(namespace, "hold")["status"]["podIP"].startswith(node.pod_prefix + ".")

    logs = wait_for(lambda: cluster.logs(namespace, "hold"), what="the container's log")
    assert logs.startswith("uid 1000 pid 1"), logs
    exec_id = cluster.kubectl("exec", "-n", namespace, "hold", "--", "id", "-u").stdout
    assert exec_id.strip() == "1000"
    cluster.kubectl("exec", "-n", namespace, "hold", "--", "touch", "/tmp/finish")

    terminated = wait_for(
        lambda: container_status(cluster, namespace, "hold").get("state", {}).get("terminated"),
        what="the container to end",
    )
    assert terminated["exitCode"] == 3
    assert terminated["message"] == "finished as asked"  # read by the kubelet from /dev/termination-log
    wait_for(lambda: cluster.pod(namespace, "hold")["status"]["phase"] == "Failed", what="phase Failed")


def test_pods_on_two_real_nodes_talk_by_the_headless_services_dns_name(
    cluster: Cluster, namespace: str, real_nodes: list[RealNode]
) -> None:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "svc"},
        "spec": {"clusterIP": "None", "selector": {"app": "a"}, "ports": [{"port": 8080}]},
    }
    server = pod("a", real_nodes[0].name, SERVER, labels={"app": "a"}, hostname="a-host", subdomain="svc")
    client = pod("b", real_nodes[1].name, CLIENT)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifests(service, server, client))
    terminated = wait_for(
        lambda: container_status(cluster, namespace, "b").get("state", {}).get("terminated"),
        what="the client pod on the other node to end",
        timeout=240,
    )
    server_ip = cluster.pod(namespace, "a")["status"]["podIP"]
    client_ip = cluster.pod(namespace, "b")["status"]["podIP"]
    assert server_ip.startswith(real_nodes[0].pod_prefix + ".")
    assert client_ip.startswith(real_nodes[1].pod_prefix + ".")
    assert terminated["exitCode"] == 0, terminated
    assert terminated["message"] == f"got: hello from a-host to {client_ip}"


def test_each_node_holds_one_copy_of_the_images(real_nodes: list[RealNode]) -> None:
    """After every import, whatever builds came before: no image record of an older build is left (it
    would keep that build's ~6 GB of snapshots), and the node's containerd holds about one unpacked
    trainer (6.1 GB measured), not one per build."""
    for node in real_nodes:
        assert nodeimages.drop_unnamed(node.socket) == [], f"{node.name} kept an older build's image"
        du = subprocess.run(["du", "-sb", str(node.containerd_root)], capture_output=True, text=True)
        held = int(du.stdout.split()[0])  # (files of running containers may go while du reads)
        assert held < 9e9, f"{node.name}'s containerd holds {held / 1e9:.1f} GB"
