"""What a real node (:mod:`realnode`) runs with: its addresses and directories (:class:`RealNode`), and the
configuration of its containerd, CNI network and kubelet, and the kubeconfig it authenticates with.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from . import certs, controlplane, nodeimages
from .layout import (
    BRIDGE,
    BRIDGE_IP,
    CLUSTER_DOMAIN,
    DNS_SERVICE_IP,
    POD_CIDR,
    SERVICE_CIDR,
    Layout,
)

REAL_NODES = ("real-1", "real-2")
LABEL = "ddpjob.io/real-node"
TAINT = {"key": LABEL, "value": "true", "effect": "NoSchedule"}


@dataclass(frozen=True)
class RealNode:
    layout: Layout
    index: int  # 0-based

    @property
    def name(self) -> str:
        return REAL_NODES[self.index]

    @property
    def ip(self) -> str:
        """The node's InternalIP: its own address on the bridge; its kubelet serves there."""
        return f"10.244.0.{11 + self.index}"

    @property
    def pod_prefix(self) -> str:
        return f"10.244.{11 + self.index}"

    @property
    def dir(self) -> Path:
        return self.layout.root / "nodes" / self.name

    @property
    def containerd_root(self) -> Path:
        """Images and snapshots: outside ``.cluster`` (which every ``up`` replaces), in the build cache, so
        the 6 GB trainer image is unpacked once per machine and image version, not once per cluster."""
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        return cache / "ddpjob" / "nodes" / self.name / "containerd"

    @property
    def socket(self) -> Path:
        return self.dir / "containerd" / "containerd.sock"

    @property
    def cgroup_root(self) -> str:
        return f"/ddpjob-{self.name}"

    @property
    def kubelet_pid(self) -> Path:
        return self.layout.pid(f"kubelet-{self.name}")

    @property
    def containerd_pid(self) -> Path:
        return self.layout.pid(f"containerd-{self.name}")


def containerd_config(node: RealNode) -> str:
    d = node.dir
    return f"""version = 2
root = "{node.containerd_root}"
state = "{d / "containerd" / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{node.socket}"
[plugins."io.containerd.gc.v1.scheduler"]
  deletion_threshold = 1  # a deleted blob (nodeimages.drop_layer_blobs) leaves the disk at once
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{nodeimages.PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_cdi = false
  # this machine's root lacks CAP_SYS_RESOURCE: an oom_score_adj below containerd's own is refused
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d / "cni" / "net.d"}"
"""


def cni_config(node: RealNode) -> dict[str, object]:
    """The existing bridge, this node's slice of the pod network, a route to the service network via the
    bridge (CoreDNS and the ``kubernetes`` proxy live there) and, as in the process tier, no default route."""
    prefix_len = POD_CIDR.split("/")[1]
    return {
        "cniVersion": "0.4.0",
        "name": f"ddpjob-{node.name}",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": False,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(node.dir / "cni" / "ipam"),
                    "ranges": [
                        [
                            {
                                "subnet": f"{POD_CIDR.split('/')[0]}/{prefix_len}",
                                "rangeStart": f"{node.pod_prefix}.2",
                                "rangeEnd": f"{node.pod_prefix}.254",
                                "gateway": BRIDGE_IP,
                            }
                        ]
                    ],
                    "routes": [{"dst": SERVICE_CIDR, "gw": BRIDGE_IP}],
                },
            }
        ],
    }


def kubelet_config(node: RealNode) -> dict[str, object]:
    pki = node.dir / "pki"
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,  # this machine mounts cgroup v1 hierarchies
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": node.cgroup_root,
        "address": node.ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10348 + node.index,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(node.layout.pki / "ca.crt")},
        },
        # only the API server holds a client certificate of the cluster CA (kubectl logs/exec go through it)
        "authorization": {"mode": "AlwaysAllow"},
        "tlsCertFile": str(pki / "kubelet.crt"),
        "tlsPrivateKeyFile": str(pki / "kubelet.key"),
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [DNS_SERVICE_IP],
        "resolvConf": "",  # pods get cluster DNS only, as in the process tier
        "containerRuntimeEndpoint": f"unix://{node.socket}",
        "podLogsDir": str(node.dir / "pod-logs"),
        "failSwapOn": False,
        # the disk is shared with everything else on this machine: never evict, never collect images
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "0%", "imagefs.available": "0%"},
        "registerWithTaints": [TAINT],
        "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": "4s",
        # the Lease is renewed every quarter of this (4 s), as the node agents renew theirs: the
        # controller-manager's node-monitor grace period is 16 s here, not 50 s (a 10 s renewal would flap)
        "nodeLeaseDurationSeconds": 16,
        "maxPods": 110,
    }


def node_kubeconfig(node: RealNode, pair: certs.KeyPair) -> str:
    return f"""apiVersion: v1
kind: Config
clusters:
- name: ddpjob-test
  cluster: {{server: "{controlplane.SERVER}", certificate-authority: "{node.layout.pki / "ca.crt"}"}}
users:
- name: {node.name}
  user: {{client-certificate: "{pair.cert}", client-key: "{pair.key}"}}
contexts:
- name: default
  context: {{cluster: ddpjob-test, user: {node.name}}}
current-context: default
"""
