"""Real nodes: a kubelet (built from the same ``k8s.io/kubernetes`` module as the control plane) and its own
containerd (Debian's 1.6, runc, the CNI plugins in ``/usr/lib/cni``) per Node, beside the node agents.

Nodes ``real-1`` and ``real-2`` join the running test cluster on demand
(:func:`realfixture.running_real_nodes`), tainted ``ddpjob.io/real-node=true:NoSchedule`` so that no pod
of the process tier lands there: a pod for a real node tolerates the taint and selects the label
``ddpjob.io/real-node``. A node keeps its files under ``.cluster/nodes/<node>/`` (containerd's state and
socket, the kubelet's root dir, pod logs, CNI config and IPAM state, certificates), but for containerd's
root, the images (:attr:`RealNode.containerd_root`). Both run in the host's network namespace (a kubelet
per network namespace would need a route to the API server on 127.0.0.1 and gains nothing here): each
node has its own address on the pod bridge ``ddpjob0`` (10.244.0.11, .12), where its kubelet serves on
:10250, and its pods get 10.244.11.x / 10.244.12.x on the same bridge through the CNI ``bridge`` plugin
with ``host-local`` IPAM, so pods on the two nodes reach each other directly, and CoreDNS and the
``kubernetes`` Service's proxy (which a node agent holds on the bridge) as the process tier's pods do.
Cgroups: v1 (``failCgroupV1: false``), driver cgroupfs, one ``cgroupRoot`` per node. Root here lacks
CAP_SYS_RESOURCE, so containerd may only raise oom_score_adj (``restrict_oom_score_adj``). The kubelet adds
its iptables chains (``KUBE-FIREWALL``, ``KUBE-KUBELET-CANARY``) to the host's tables, as on any node.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import certs, controlplane, nodeimages, processes
from .layout import BRIDGE, Layout
from .nodeconfig import (
    LABEL,
    REAL_NODES,
    RealNode,
    cni_config,
    containerd_config,
    kubelet_config,
    node_kubeconfig,
)

CGROUP_V1 = Path("/sys/fs/cgroup")


def _cgroup_dirs(node: RealNode) -> list[Path]:
    return [c / node.cgroup_root.lstrip("/") for c in CGROUP_V1.iterdir() if c.name != "unified"]


def write_configs(node: RealNode) -> None:
    """Certificates (client ``system:node:<name>`` in ``system:nodes``, for the Node authorizer; serving
    for the node's IP), kubeconfig, containerd, CNI and kubelet configuration, the node's cgroups."""
    shutil.rmtree(node.dir / "cni" / "ipam", ignore_errors=True)  # no pod of the node runs: none is taken
    for sub in ("containerd", "cni/net.d", "cni/ipam", "kubelet", "pod-logs", "pki", "config"):
        (node.dir / sub).mkdir(parents=True, exist_ok=True)
    pki = node.dir / "pki"
    ca = certs.KeyPair(node.layout.pki / "ca.crt", node.layout.pki / "ca.key")
    client = certs.issue(
        ca, pki, "client", common_name=f"system:node:{node.name}", organizations=["system:nodes"], client=True
    )
    certs.issue(
        ca,
        pki,
        "kubelet",
        common_name=f"system:node:{node.name}",
        server=True,
        dns_names=[node.name],
        ip_addresses=[node.ip],
    )
    config = node.dir / "config"
    (config / "kubeconfig").write_text(node_kubeconfig(node, client))
    (config / "containerd.toml").write_text(containerd_config(node))
    (config / "kubelet.json").write_text(json.dumps(kubelet_config(node), indent=1))
    (node.dir / "cni" / "net.d" / "10-ddpjob.conflist").write_text(json.dumps(cni_config(node), indent=1))
    for cgroup in _cgroup_dirs(node):
        cgroup.mkdir(exist_ok=True)
        if cgroup.parent.name == "cpuset":  # a new cpuset is empty: give it its parent's cpus and memory
            for knob in ("cpuset.cpus", "cpuset.mems"):
                (cgroup / knob).write_text((cgroup.parent / knob).read_text())


def start(node: RealNode, bin_dir: Path) -> None:
    subprocess.run(["ip", "addr", "replace", f"{node.ip}/32", "dev", BRIDGE], check=True)
    config = node.dir / "config"
    processes.spawn(
        f"containerd-{node.name}",
        ["containerd", f"--config={config / 'containerd.toml'}"],
        pid_file=node.containerd_pid,
        log_file=node.layout.log(f"containerd-{node.name}"),
    )
    controlplane.wait_until(
        f"containerd of {node.name}",
        lambda: (
            subprocess.run(
                ["ctr", f"--address={node.socket}", "version"], capture_output=True, check=False
            ).returncode
            == 0
        ),
        timeout=60,
        log=node.layout.log(f"containerd-{node.name}"),
    )
    log = node.layout.log(f"kubelet-{node.name}")
    for attempt in range(1, KUBELET_STARTS + 1):
        before = _socket_identity()
        kubelet = processes.spawn(
            f"kubelet-{node.name}",
            [
                str(bin_dir / "kubelet"),
                f"--config={config / 'kubelet.json'}",
                f"--kubeconfig={config / 'kubeconfig'}",
                f"--root-dir={node.dir / 'kubelet'}",
                f"--hostname-override={node.name}",
                f"--node-ip={node.ip}",
                f"--node-labels={LABEL}=true",
                "--v=1",
            ],
            pid_file=node.kubelet_pid,
            log_file=log,
        )
        try:  # before the next node's kubelet starts: see DEVICE_PLUGINS_SOCKET
            controlplane.wait_until(
                f"the kubelet of {node.name} binding {DEVICE_PLUGINS_SOCKET}",
                lambda was=before, proc=kubelet: _rebound(was) or proc.poll() is not None,
                timeout=30,
                log=log,
            )
        except TimeoutError as err:
            print(f"real node {node.name}: {err}; going on", file=sys.stderr, flush=True)
        if kubelet.poll() is None:
            return
        print(
            f"real node {node.name}: its kubelet exited {kubelet.returncode} as it started (attempt {attempt}"
            f" of {KUBELET_STARTS}; see {log}): starting it again in 1 s, as systemd's Restart= would",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(1)
    raise RuntimeError(f"the kubelet of {node.name} exited as it started {KUBELET_STARTS} times; see {log}")


KUBELET_STARTS = 5
"""How often a node's kubelet is started when it exits at once: containerd answers ``ctr version`` before
its CRI plugin has recovered its state (``server is not initialized yet``: a node whose containerd root
holds earlier runs' sandboxes took 0.1 s), and a kubelet that finds the CRI not ready exits, as it does
under systemd, which starts it again."""


DEVICE_PLUGINS_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")
"""The kubelet's device-plugin registry socket: one host path for every kubelet, whatever its
``--root-dir``. Each kubelet removes what it finds in that folder and then binds; two starting together
can interleave so that the second's bind fails (``address already in use``) and it exits before its Node
registers. So a node's kubelet is started only once the one before it has bound."""


def _rebound(before: tuple[int, int] | None) -> bool:
    """The registry socket is there, and another than ``before`` (:func:`_socket_identity`)."""
    now = _socket_identity()
    return now is not None and now != before


def _socket_identity() -> tuple[int, int] | None:
    """The registry socket as it is now (its inode and change time), None while there is none: a kubelet
    that bound it made a new one. Compared with the one before the kubelet started, not with a clock: the
    node before it bound its own a moment earlier, and a check of "bound within the last second" took that
    bind for this kubelet's, went on at once and missed this one exiting as it started (its Node never
    registered: seen when containerd recovered an earlier run's state for 0.15 s)."""
    try:
        found = DEVICE_PLUGINS_SOCKET.stat()
    except OSError:
        return None
    return found.st_ino, found.st_ctime_ns


def stop(node: RealNode) -> None:
    """Stops the kubelet, then every container of the node (containerd's tasks; the kubelet leaves them
    running by design) and the network namespaces of its pods' sandboxes, then containerd; unmounts what
    is left under the node's directory. Works without the API server (``down`` after a crash)."""
    processes.stop(node.kubelet_pid, grace=10)
    netns: set[str] = set()
    if processes.read_pid(node.containerd_pid) is not None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            for container in nodeimages.ctr(node.socket, "containers", "ls", "-q", timeout=30).split():
                netns |= _netns_of(node, container)
            for task in nodeimages.ctr(node.socket, "tasks", "ls", "-q", timeout=30).split():
                with contextlib.suppress(RuntimeError):
                    nodeimages.ctr(node.socket, "tasks", "kill", "--all", "--signal=SIGKILL", task)
        time.sleep(0.5)
    processes.stop(node.containerd_pid, grace=10)
    for path in netns:  # what the CNI plugins' DEL would have removed, had the kubelet deleted the pods
        subprocess.run(["ip", "netns", "delete", Path(path).name], capture_output=True, check=False)
    _unmount_below(node.dir)
    subprocess.run(["ip", "addr", "del", f"{node.ip}/32", "dev", BRIDGE], capture_output=True, check=False)


def _netns_of(node: RealNode, container: str) -> set[str]:
    """The named network namespace (``/var/run/netns/cni-…``) a pod sandbox of the node holds, if any."""
    with contextlib.suppress(RuntimeError, ValueError, KeyError, TypeError):
        spec = json.loads(nodeimages.ctr(node.socket, "containers", "info", container, timeout=30))["Spec"]
        return {
            ns["path"]
            for ns in spec["linux"]["namespaces"]
            if ns["type"] == "network" and ns.get("path", "").startswith("/var/run/netns/cni-")
        }
    return set()


def _unmount_below(root: Path) -> None:
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for point in sorted((m for m in mounts if m.startswith(f"{root}/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def nodes(layout: Layout) -> list[RealNode]:
    return [RealNode(layout, i) for i in range(len(REAL_NODES))]


def down(layout: Layout) -> list[str]:
    """Stops every real node of ``layout`` that runs; returns their names."""
    stopped = []
    for node in nodes(layout):
        if processes.read_pid(node.kubelet_pid) or processes.read_pid(node.containerd_pid):
            stop(node)
            cleanup_cgroups(node)
            stopped.append(f"kubelet and containerd of {node.name}")
    return stopped


def cleanup_cgroups(node: RealNode) -> None:
    for cgroup in _cgroup_dirs(node):
        with contextlib.suppress(OSError):
            for sub in sorted(cgroup.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if sub.is_dir():
                    os.rmdir(sub)
            os.rmdir(cgroup)
