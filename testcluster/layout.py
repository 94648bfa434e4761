"""Where the test cluster keeps its files, and the addresses and ports it uses.

Everything lives under ``<repo>/.cluster/`` (git-ignored; ``down`` keeps it for its logs, ``up``
replaces it). The binaries live outside the work tree, in the build cache ``hack/cluster/build.sh``
prints. Ports are on 127.0.0.1 only; pod addresses are on a bridge with no route anywhere else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO_ROOT / "hack" / "cluster" / "build.sh"

CLUSTER_DOMAIN = "cluster.local"
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
DNS_SERVICE_IP = "10.96.0.10"
POD_CIDR = "10.244.0.0/16"
BRIDGE = "ddpjob0"
BRIDGE_IP = "10.244.0.1"
NETNS_PREFIX = "ddpjob-"

ETCD_CLIENT_PORT = 22379
ETCD_PEER_PORT = 22380
APISERVER_PORT = 16443
COREDNS_HEALTH_PORT = 18080
COREDNS_READY_PORT = 18181
KUBELET_PORT = 10250  # node i serves logs on KUBELET_PORT + i

NODE_NAMES = ("node-1", "node-2")
NODE_CAPACITY = {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4", "pods": "110"}


def node_pod_cidr(index: int) -> str:
    """Node ``index`` (0-based) owns 10.244.<index+1>.0/24 of the pod network."""
    return f"10.244.{index + 1}.0/24"


@dataclass(frozen=True)
class Layout:
    """The files of one cluster. ``root`` is ``<repo>/.cluster`` unless ``DDPJOB_CLUSTER_DIR`` says so."""

    root: Path

    @classmethod
    def default(cls) -> Layout:
        return cls(Path(os.environ.get("DDPJOB_CLUSTER_DIR") or REPO_ROOT / ".cluster"))

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def pods(self) -> Path:
        """Per-pod state written by the node agent: container logs, termination logs, pid files."""
        return self.root / "pods"

    @property
    def config(self) -> Path:
        return self.root / "config"

    @property
    def tokens_file(self) -> Path:
        return self.config / "tokens.csv"

    @property
    def bin_file(self) -> Path:
        """Records which cached binaries this cluster runs."""
        return self.root / "bin-dir"

    @property
    def audit_policy(self) -> Path:
        return self.config / "audit-policy.yaml"

    @property
    def audit_log(self) -> Path:
        """The API server's audit log (JSON lines): every request of a ServiceAccount outside kube-system."""
        return self.logs / "audit.log"

    def component_kubeconfig(self, name: str) -> Path:
        return self.config / f"{name}.kubeconfig"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def pid(self, name: str) -> Path:
        return self.pids / f"{name}.pid"
