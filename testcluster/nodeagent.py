"""The node agent: stands in for the kubelet of every test Node, in one process.

It registers the Nodes (cpu, memory and ``nvidia.com/gpu`` capacity, a pod CIDR each), renews their
Leases in ``kube-node-lease`` and keeps their Ready condition fresh, runs each pod bound to them
(:class:`podrunner.PodRunner`), finishes graceful deletions, and serves ``kubectl logs``
(:mod:`kubeletapi`). Pods are found by a watch (for promptness) and a periodic list (for certainty).

Run: ``python -m cluster.nodeagent --kubeconfig .cluster/kubeconfig`` (``hack/cluster/cluster up`` does).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import kubeletapi, serviceproxy
from . import layout as layout_mod
from .kubeapi import ApiError, Kube, final_delete_options
from .layout import APISERVER_PORT, KUBELET_PORT, NODE_CAPACITY, NODE_NAMES, Layout, node_pod_cidr
from .podrunner import NodeInfo, PodRunner

log = logging.getLogger("nodeagent")

LEASE_SECONDS = 16  # = the controller-manager's --node-monitor-grace-period (controlplane.py)
RENEW_EVERY = 4.0
STATUS_EVERY = 30.0
RESYNC_EVERY = 2.0
SERVICE_ACCOUNT_MOUNT_POINTS = [
    Path("/var/run/secrets/kubernetes.io/serviceaccount"),
    Path("/var/run/secrets/kubernetes.io"),
    Path("/var/run/secrets"),
]
KUBELET_VERSION = "v1.34.4"  # the version the Nodes report; the agent speaks for that kubelet's API


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_object(node: NodeInfo) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": {
                "kubernetes.io/hostname": node.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "nvidia.com/gpu.present": "true",
                "ddpjob.io/test-node": "true",
            },
        },
        "spec": {"podCIDR": node.pod_cidr, "podCIDRs": [node.pod_cidr]},
    }


def node_status(node: NodeInfo, previous: dict[str, Any] | None = None) -> dict[str, Any]:
    now = _now()
    before = {c["type"]: c for c in (previous or {}).get("conditions") or []}

    def condition(kind: str, status: str, reason: str, message: str) -> dict[str, Any]:
        old = before.get(kind) or {}
        moved = old.get("status") != status or not old.get("lastTransitionTime")
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now if moved else old["lastTransitionTime"],
        }

    return {
        "capacity": dict(node.allocatable),
        "allocatable": dict(node.allocatable),
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "agent has sufficient memory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "agent has no disk pressure"),
            condition(
                "PIDPressure", "False", "KubeletHasSufficientPID", "agent has sufficient PID available"
            ),
            condition("Ready", "True", "KubeletReady", "ddpjob node agent is posting ready status"),
        ],
        "addresses": [
            {"type": "InternalIP", "address": node.host_ip},
            {"type": "Hostname", "address": node.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": KUBELET_PORT + node.index}},
        "nodeInfo": {
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
            "kernelVersion": "",
            "osImage": "ddpjob test node",
            "containerRuntimeVersion": "ddpjob-agent://1",
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


class IPAllocator:
    """Hands out pod IPs from a node's /24 (``.2`` up), reusing released ones."""

    def __init__(self, cidr: str) -> None:
        self._free = [str(ip) for ip in list(ipaddress.ip_network(cidr).hosts())[1:]]
        self._lock = threading.Lock()

    def take(self) -> str:
        with self._lock:
            return self._free.pop(0)

    def give_back(self, ip: str) -> None:
        with self._lock:
            self._free.append(ip)


class NodeAgent:
    def __init__(self, kube: Kube, layout: Layout, nodes: list[NodeInfo]) -> None:
        self.kube, self.layout, self.nodes = kube, layout, {n.name: n for n in nodes}
        self.ips = {n.name: IPAllocator(n.pod_cidr) for n in nodes}
        self.runners: dict[str, PodRunner] = {}  # by pod uid, while running
        self.finished: dict[str, PodRunner] = {}  # by pod uid: never run a pod twice; logs stay readable
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self.proxy: serviceproxy.ServiceProxy | None = None
        self._absent_mount_points: list[Path] = []

    # -- nodes --------------------------------------------------------------------------------------------
    def register(self) -> None:
        for node in self.nodes.values():
            try:
                self.kube.create("/api/v1/nodes", node_object(node))
            except ApiError as exc:
                if exc.status != 409:
                    raise
            self._post_status(node)
            self._renew_lease(node)
            log.info("node %s registered (pod CIDR %s)", node.name, node.pod_cidr)

    def _post_status(self, node: NodeInfo) -> None:
        current = self.kube.get_or_none(f"/api/v1/nodes/{node.name}") or {}
        status = node_status(node, current.get("status"))
        self.kube.patch(f"/api/v1/nodes/{node.name}/status", {"status": status})

    def _renew_lease(self, node: NodeInfo) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node.name}"
        spec = {"holderIdentity": node.name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": _micro_now()}
        if self.kube.patch(path, {"spec": spec}) is None:
            owner = self.kube.get(f"/api/v1/nodes/{node.name}")["metadata"]
            self.kube.create(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {
                        "name": node.name,
                        "ownerReferences": [
                            {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": owner["uid"]}
                        ],
                    },
                    "spec": spec,
                },
            )

    def heartbeat_loop(self) -> None:
        last_status = time.monotonic()
        while not self.stopping.wait(RENEW_EVERY):
            for node in self.nodes.values():
                try:
                    self._renew_lease(node)
                    if time.monotonic() - last_status >= STATUS_EVERY:
                        self._post_status(node)
                except Exception as exc:
                    log.warning("node %s heartbeat failed: %s", node.name, exc)
            if time.monotonic() - last_status >= STATUS_EVERY:
                last_status = time.monotonic()
            self._ensure_service_proxy()  # after the Leases: it must never delay them

    # -- pods ---------------------------------------------------------------------------------------------
    def watch_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                for event in self.kube.watch("/api/v1/pods", timeout_seconds=60):
                    if self.stopping.is_set():
                        return
                    node = ((event.get("object") or {}).get("spec") or {}).get("nodeName")
                    if node in self.nodes:
                        self.wake.set()
            except Exception as exc:
                log.debug("pod watch ended: %s", exc)
                self.stopping.wait(1.0)

    def sync_loop(self) -> None:
        while not self.stopping.is_set():
            self.wake.wait(RESYNC_EVERY)
            self.wake.clear()
            if self.stopping.is_set():
                return
            try:
                self.sync()
            except Exception:
                log.exception("pod sync failed")

    def sync(self) -> None:
        seen: set[str] = set()
        for node in self.nodes.values():
            pods = self.kube.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node.name}")["items"]
            for pod in pods:
                seen.add(pod["metadata"]["uid"])
                self._sync_pod(node, pod)
        with self._lock:
            vanished = [r for uid, r in self.runners.items() if uid not in seen]
        for runner in vanished:  # force-deleted (grace 0) by someone: stop at once
            runner.terminate(0, delete=False)

    def _sync_pod(self, node: NodeInfo, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        deleting = meta.get("deletionTimestamp") is not None
        with self._lock:
            runner = self.runners.get(uid)
            done = uid in self.finished
        if runner is not None:
            if deleting:
                runner.terminate(float(meta.get("deletionGracePeriodSeconds") or 0))
            return
        if deleting:  # not running (finished, or never started): the kubelet's final delete
            self.kube.delete(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                final_delete_options(uid),
            )
            return
        if done or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        if (pod.get("status") or {}).get("containerStatuses"):
            self._lost(pod)  # started by this node's agent before it stopped: its processes are gone
            return
        runner = PodRunner(
            kube=self.kube,
            layout=self.layout,
            node=node,
            pod=pod,
            pod_ip=self.ips[node.name].take(),
            on_exit=self._runner_exited,
        )
        with self._lock:
            self.runners[uid] = runner
        log.info(
            "pod %s/%s on %s: starting (IP %s)", meta["namespace"], meta["name"], node.name, runner.pod_ip
        )
        runner.start()

    def _lost(self, pod: dict[str, Any]) -> None:
        """What the kubelet reports for a pod whose containers vanished while it was away: Failed, each
        container terminated with 137 and reason ContainerStatusUnknown (restartPolicy is never honoured
        again for them: a test pod's processes do not survive its agent)."""
        meta = pod["metadata"]
        gone = {
            "exitCode": 137,
            "reason": "ContainerStatusUnknown",
            "message": "The container could not be located when the pod was terminated",
            "finishedAt": _now(),
        }
        statuses = [
            {**status, "ready": False, "started": False, "state": {"terminated": gone}}
            for status in pod["status"]["containerStatuses"]
        ]
        log.info(
            "pod %s/%s: its processes went with a previous agent; reporting it Failed",
            meta["namespace"],
            meta["name"],
        )
        self.kube.patch(
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
            {"status": {"phase": "Failed", "containerStatuses": statuses}},
        )

    def _runner_exited(self, runner: PodRunner) -> None:
        with self._lock:
            self.runners.pop(runner.uid, None)
            self.finished[runner.uid] = runner
        self.ips[runner.node.name].give_back(runner.pod_ip)
        self.wake.set()

    def find_runner(self, namespace: str, name: str) -> PodRunner | None:
        """The newest runner of pod ``namespace/name`` (running or finished), for the logs endpoint."""
        with self._lock:
            candidates = [
                r
                for r in [*self.finished.values(), *self.runners.values()]
                if r.namespace == namespace and r.name == name
            ]
        return max(candidates, key=lambda r: r.start_time, default=None)

    # -- lifecycle ----------------------------------------------------------------------------------------
    def run(self) -> None:
        self._absent_mount_points = [p for p in SERVICE_ACCOUNT_MOUNT_POINTS if not p.exists()]
        self.register()
        self._ensure_service_proxy()
        for node in self.nodes.values():
            kubeletapi.serve(self, self.layout, port=KUBELET_PORT + node.index, name=node.name)
        threads = [
            threading.Thread(target=t, name=t.__name__, daemon=True)
            for t in (self.heartbeat_loop, self.watch_loop, self.sync_loop)
        ]
        for t in threads:
            t.start()
        self.stopping.wait()
        self.shutdown()

    def _ensure_service_proxy(self) -> None:
        """One agent per Node, one host network: the first agent to bind the ``kubernetes`` Service's
        address serves it; the others try again at every heartbeat, so one takes over when it stops."""
        if self.proxy is not None:
            return
        try:
            self.proxy = self._start_service_proxy()
        except Exception as exc:  # bound by another agent, or the API server is away: the next beat retries
            log.debug("service proxy not started here: %s", exc)

    def _start_service_proxy(self) -> serviceproxy.ServiceProxy:
        """Pods reach the API server at the ``kubernetes`` Service's ClusterIP and port (see serviceproxy)."""
        service = None
        for _ in range(600):  # the API server creates it shortly after it is ready
            service = self.kube.get_or_none(serviceproxy.MASTER_SERVICE_PATH)
            if service or self.stopping.wait(0.1):
                break
        if not service:
            raise RuntimeError("Service default/kubernetes did not appear within 60 s")
        listen = (service["spec"]["clusterIP"], int(service["spec"]["ports"][0]["port"]))
        return serviceproxy.ServiceProxy(listen, ("127.0.0.1", APISERVER_PORT)).start()

    def shutdown(self) -> None:
        """Agent stopping: kill every pod's processes now and remove their namespaces (not the Pods)."""
        with self._lock:
            runners = list(self.runners.values())
        for runner in runners:
            runner.terminate(0, delete=False)
        for runner in runners:
            runner.done.wait(10)
        if self.proxy is not None:
            self.proxy.close()
        for folder in self._absent_mount_points:  # made on the host as mount points: remove them
            with contextlib.suppress(OSError):
                folder.rmdir()


def default_nodes() -> list[NodeInfo]:
    return [
        NodeInfo(name, i, "127.0.0.1", node_pod_cidr(i), dict(NODE_CAPACITY))
        for i, name in enumerate(NODE_NAMES)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", default=str(Layout.default().kubeconfig))
    parser.add_argument(
        "--node",
        action="append",
        choices=NODE_NAMES,
        help="a Node this agent runs (repeatable; default: all)",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    nodes = [node for node in default_nodes() if not args.node or node.name in args.node]
    agent = NodeAgent(Kube(args.kubeconfig), layout_mod.Layout.default(), nodes)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stopping.set())
    agent.run()


if __name__ == "__main__":
    main()
