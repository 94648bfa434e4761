"""etcd, kube-apiserver, kube-controller-manager, kube-scheduler and CoreDNS as local processes.

``generate`` writes certificates, the static token file, kubeconfigs and the Corefile; ``start_*`` launch
each component with its pid file and log under ``.cluster/``; ``wait_*`` poll their health endpoints.
Authorization is Node,RBAC; every component authenticates with its own token, under the user name the
built-in RBAC roles expect (``system:kube-controller-manager``, ``system:kube-scheduler``). The API server
writes an audit log of ServiceAccounts' requests (``.cluster/logs/audit.log``, :data:`AUDIT_POLICY`).
"""

from __future__ import annotations

import json
import secrets
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from . import certs, processes
from .layout import (
    APISERVER_PORT,
    BRIDGE_IP,
    CLUSTER_DOMAIN,
    COREDNS_HEALTH_PORT,
    COREDNS_READY_PORT,
    DNS_SERVICE_IP,
    ETCD_CLIENT_PORT,
    ETCD_PEER_PORT,
    KUBERNETES_SERVICE_IP,
    SERVICE_CIDR,
    Layout,
)

SERVICE_ACCOUNT_ISSUER = f"https://kubernetes.default.svc.{CLUSTER_DOMAIN}"
SERVER = f"https://127.0.0.1:{APISERVER_PORT}"

# user name, groups: one static token each (the file the API server reads with --token-auth-file)
USERS = {
    "admin": ("admin", ["system:masters"]),
    "kube-controller-manager": ("system:kube-controller-manager", []),
    "kube-scheduler": ("system:kube-scheduler", []),
    "coredns": ("system:coredns", []),
}


def kubeconfig_text(server: str, ca_file: Path, user: str, token: str, namespace: str = "default") -> str:
    return f"""apiVersion: v1
kind: Config
clusters:
- name: ddpjob-test
  cluster:
    server: {server}
    certificate-authority: {ca_file}
users:
- name: {user}
  user:
    token: {token}
contexts:
- name: default
  context:
    cluster: ddpjob-test
    user: {user}
    namespace: {namespace}
current-context: default
"""


def generate(layout: Layout) -> None:
    """Writes everything the components need; a fresh CA and fresh tokens every time."""
    for d in (layout.pki, layout.config, layout.logs, layout.pids, layout.pods, layout.etcd_data):
        d.mkdir(parents=True, exist_ok=True)
    layout.etcd_data.chmod(0o700)
    ca = certs.make_ca(layout.pki)
    certs.issue(
        ca,
        layout.pki,
        "apiserver",
        common_name="kube-apiserver",
        server=True,
        dns_names=[
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            f"kubernetes.default.svc.{CLUSTER_DOMAIN}",
        ],
        ip_addresses=["127.0.0.1", KUBERNETES_SERVICE_IP],
    )
    certs.issue(
        ca,
        layout.pki,
        "apiserver-kubelet-client",
        common_name="kube-apiserver-kubelet-client",
        organizations=["system:masters"],
        client=True,
    )
    certs.issue(
        ca,
        layout.pki,
        "kubelet",
        common_name="ddpjob-node-agent",
        server=True,
        dns_names=["localhost"],
        ip_addresses=["127.0.0.1"],
    )
    certs.make_service_account_keys(layout.pki)

    lines = []
    for name, (user, groups) in USERS.items():
        token = secrets.token_hex(16)
        lines.append(f"{token},{user},{user}" + (f',"{",".join(groups)}"' if groups else ""))
        text = kubeconfig_text(SERVER, ca.cert, user, token)
        target = layout.kubeconfig if name == "admin" else layout.component_kubeconfig(name)
        target.write_text(text)
        target.chmod(0o600)
    layout.tokens_file.write_text("\n".join(lines) + "\n")
    layout.tokens_file.chmod(0o600)
    (layout.config / "Corefile").write_text(corefile(layout))
    layout.audit_policy.write_text(AUDIT_POLICY)


# Metadata (who, verb, resource, name, response code, time) for every request of a ServiceAccount outside
# kube-system (the controller-manager's controllers are kube-system accounts): the tests read which verbs
# the operator used. And every DDPJob's creation, by anyone: the benchmark times the operator's answer from
# it (bench/operator_bench.py). Nothing else is logged, so the file stays small.
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    userGroups: ["system:serviceaccounts:kube-system"]
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: Metadata
    verbs: ["create"]
    resources: [{group: ddpjob.io, resources: [ddpjobs]}]
  - level: None
"""


def corefile(layout: Layout) -> str:
    return f""".:53 {{
    bind {DNS_SERVICE_IP} {BRIDGE_IP}
    errors
    log
    health 127.0.0.1:{COREDNS_HEALTH_PORT}
    ready 127.0.0.1:{COREDNS_READY_PORT}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {layout.component_kubeconfig("coredns")} default
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
}}
"""


def _spawn(layout: Layout, bin_dir: Path, name: str, binary: str, args: list[str]) -> None:
    processes.spawn(
        name, [str(bin_dir / binary), *args], pid_file=layout.pid(name), log_file=layout.log(name)
    )


def start_etcd(layout: Layout, bin_dir: Path) -> None:
    _spawn(
        layout,
        bin_dir,
        "etcd",
        "etcd",
        [
            "--name=default",
            f"--data-dir={layout.etcd_data}",
            f"--listen-client-urls=http://127.0.0.1:{ETCD_CLIENT_PORT}",
            f"--advertise-client-urls=http://127.0.0.1:{ETCD_CLIENT_PORT}",
            f"--listen-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}",
            f"--initial-cluster=default=http://127.0.0.1:{ETCD_PEER_PORT}",
            "--unsafe-no-fsync",  # a throw-away test store: durability buys nothing, fsync costs seconds
            "--log-level=warn",
        ],
    )


def start_apiserver(layout: Layout, bin_dir: Path) -> None:
    pki = layout.pki
    _spawn(
        layout,
        bin_dir,
        "kube-apiserver",
        "kube-apiserver",
        [
            f"--etcd-servers=http://127.0.0.1:{ETCD_CLIENT_PORT}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",  # Endpoints refuse loopback addresses; pods cannot reach it
            f"--secure-port={APISERVER_PORT}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={layout.tokens_file}",
            "--authorization-mode=Node,RBAC",
            "--anonymous-auth=false",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={pki / 'ca.crt'}",
            "--kubelet-preferred-address-types=InternalIP",
            "--allow-privileged=true",
            "--profiling=false",
            f"--audit-policy-file={layout.audit_policy}",
            f"--audit-log-path={layout.audit_log}",
            "--audit-log-format=json",
            "--audit-log-maxsize=200",  # MB, then one rotated file
            "--audit-log-maxbackup=1",
        ],
    )


def start_controller_manager(layout: Layout, bin_dir: Path) -> None:
    pki = layout.pki
    _spawn(
        layout,
        bin_dir,
        "kube-controller-manager",
        "kube-controller-manager",
        [
            f"--kubeconfig={layout.component_kubeconfig('kube-controller-manager')}",
            "--secure-port=0",
            "--leader-elect=false",
            "--controllers=*",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            "--allocate-node-cidrs=false",  # the node agent sets each Node's podCIDR itself
            # A lost node is NotReady (and tainted unreachable) 16 s after its last Lease renewal (the
            # agent renews every 4 s), not 50 s: tests of node loss wait for it.
            "--node-monitor-grace-period=16s",
            "--node-monitor-period=2s",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--profiling=false",
        ],
    )


def start_scheduler(layout: Layout, bin_dir: Path) -> None:
    _spawn(
        layout,
        bin_dir,
        "kube-scheduler",
        "kube-scheduler",
        [
            f"--kubeconfig={layout.component_kubeconfig('kube-scheduler')}",
            "--secure-port=0",
            "--leader-elect=false",
            "--profiling=false",
        ],
    )


def start_coredns(layout: Layout, bin_dir: Path) -> None:
    _spawn(layout, bin_dir, "coredns", "coredns", ["-conf", str(layout.config / "Corefile")])


def http_ok(url: str, *, token: str | None = None, ca: Path | None = None) -> bool:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    context = ssl.create_default_context(cafile=str(ca)) if ca else None
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_until(what: str, check: Callable[[], bool], *, timeout: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    hint = f"; see {log}" if log else ""
    raise TimeoutError(f"{what} not ready after {timeout:.0f} s{hint}")


def admin_token(layout: Layout) -> str:
    for line in layout.kubeconfig.read_text().splitlines():
        if line.strip().startswith("token:"):
            return line.split(":", 1)[1].strip()
    raise RuntimeError(f"no token in {layout.kubeconfig}")


def etcd_healthy() -> bool:
    return http_ok(f"http://127.0.0.1:{ETCD_CLIENT_PORT}/health")


def apiserver_ready(layout: Layout) -> bool:
    return http_ok(f"{SERVER}/readyz", token=admin_token(layout), ca=layout.pki / "ca.crt")


def coredns_ready() -> bool:
    return http_ok(f"http://127.0.0.1:{COREDNS_READY_PORT}/ready")


def bootstrap_objects() -> list[tuple[str, dict[str, object]]]:
    """(collection path, object) the cluster needs before CoreDNS and the tests: CoreDNS's read access
    (the ``system:coredns`` ClusterRole kubeadm installs), and the ``kube-dns`` Service that records the
    cluster DNS address (its ClusterIP is also bound on the pod bridge, where CoreDNS listens)."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "system:coredns"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["endpoints", "services", "pods", "namespaces"],
                "verbs": ["list", "watch"],
            },
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "system:coredns"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:coredns"}],
    }
    dns_service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
        "spec": {
            "clusterIP": DNS_SERVICE_IP,
            "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
            ],
        },
    }
    return [
        ("/apis/rbac.authorization.k8s.io/v1/clusterroles", role),
        ("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding),
        ("/api/v1/namespaces/kube-system/services", dns_service),
    ]


def server_version(layout: Layout) -> dict[str, str]:
    request = urllib.request.Request(
        f"{SERVER}/version", headers={"Authorization": f"Bearer {admin_token(layout)}"}
    )
    context = ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
    with urllib.request.urlopen(request, timeout=5, context=context) as response:
        return dict(json.load(response))
