"""The pod network: one Linux bridge, and one network namespace per pod attached to it by a veth pair.

The bridge holds the gateway address (10.244.0.1/16), the cluster DNS address (10.96.0.10/32) on which
CoreDNS listens, and the ``kubernetes`` Service's address (10.96.0.1/32) on which the node agent proxies to
the API server (:mod:`serviceproxy`). A pod's namespace gets ``eth0`` with its own IP, a route to the
service network via the bridge (so those two addresses are reachable) and no default route: pod traffic
can reach other pods and the host's bridge addresses, and nothing else. ``ip netns exec`` bind-mounts
``/etc/netns/<ns>/resolv.conf`` and ``hosts`` over ``/etc/...`` for the process, which is how each pod
gets cluster DNS as its resolver.
Other ClusterIP Services are not routed (there is no kube-proxy); headless Services need nothing more.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from .layout import (
    BRIDGE,
    BRIDGE_IP,
    CLUSTER_DOMAIN,
    DNS_SERVICE_IP,
    KUBERNETES_SERVICE_IP,
    NETNS_PREFIX,
    POD_CIDR,
    SERVICE_CIDR,
)

ETC_NETNS = Path("/etc/netns")
PREFIX_LEN = int(POD_CIDR.split("/")[1])


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def bridge_exists() -> bool:
    return _ip("link", "show", BRIDGE, check=False).returncode == 0


BRIDGE_MAC = "02:dd:00:00:00:01"
"""The bridge's own, fixed MAC address (locally administered). A bridge whose address was never set takes
the lowest of its ports' and changes it as pods come and go: every pod's ARP entry for the gateway then
names a MAC no longer the bridge's, and its connections to the API server's proxy and to CoreDNS went
nowhere for 15-18 s (measured: an operator replica's requests timed out while its peer's went through),
until the entry was probed again."""


def ensure_bridge() -> None:
    if not bridge_exists():
        _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("link", "set", BRIDGE, "address", BRIDGE_MAC)
    _ip("addr", "replace", f"{BRIDGE_IP}/{PREFIX_LEN}", "dev", BRIDGE)
    _ip("addr", "replace", f"{DNS_SERVICE_IP}/32", "dev", BRIDGE)
    _ip("addr", "replace", f"{KUBERNETES_SERVICE_IP}/32", "dev", BRIDGE)  # the node agent's service proxy
    _ip("link", "set", BRIDGE, "up")


def remove_bridge() -> None:
    if bridge_exists():
        _ip("link", "delete", BRIDGE)


def netns_name(pod_uid: str) -> str:
    return NETNS_PREFIX + pod_uid[:18]


def _host_veth(ns: str) -> str:
    return "vd" + hashlib.sha1(ns.encode()).hexdigest()[:10]  # interface names: 15 bytes at most


def resolv_conf(namespace: str, dns_ip: str = DNS_SERVICE_IP, search: Sequence[str] = ()) -> str:
    """A ClusterFirst pod's resolv.conf, as the kubelet writes it."""
    domains = [f"{namespace}.svc.{CLUSTER_DOMAIN}", f"svc.{CLUSTER_DOMAIN}", CLUSTER_DOMAIN, *search]
    return f"search {' '.join(domains)}\nnameserver {dns_ip}\noptions ndots:5\n"


def hosts_file(pod_ip: str, hostname: str, fqdn: str | None) -> str:
    """The kubelet-managed /etc/hosts: localhost, and the pod's own names on its IP."""
    names = f"{fqdn}\t{hostname}" if fqdn else hostname
    return (
        "# Kubernetes-managed hosts file (ddpjob node agent).\n"
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        f"{pod_ip}\t{names}\n"
    )


def create_pod_netns(ns: str, pod_ip: str, *, resolv: str, hosts: str) -> None:
    """Creates namespace ``ns`` with ``eth0`` = ``pod_ip`` on the bridge, and its resolv.conf/hosts."""
    delete_pod_netns(ns)
    etc = ETC_NETNS / ns
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "resolv.conf").write_text(resolv)
    (etc / "hosts").write_text(hosts)
    veth = _host_veth(ns)
    _ip("netns", "add", ns)
    _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
    _ip("link", "set", veth, "master", BRIDGE, "up")
    _ip("-n", ns, "addr", "add", f"{pod_ip}/{PREFIX_LEN}", "dev", "eth0")
    _ip("-n", ns, "link", "set", "lo", "up")
    _ip("-n", ns, "link", "set", "eth0", "up")
    _ip("-n", ns, "route", "add", SERVICE_CIDR, "via", BRIDGE_IP)


def delete_pod_netns(ns: str) -> None:
    """Removes the namespace (its veth goes with it) and its /etc/netns files; no error if absent."""
    _ip("link", "delete", _host_veth(ns), check=False)
    _ip("netns", "delete", ns, check=False)
    shutil.rmtree(ETC_NETNS / ns, ignore_errors=True)


def list_pod_netns() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(NETNS_PREFIX)]


def exec_prefix(ns: str, hostname: str, setup: str = "") -> list[str]:
    """argv prefix that runs a command in pod namespace ``ns`` with its own UTS namespace and hostname,
    as a container would; every step ``exec``s, so the command keeps the pid we started. ``setup`` is
    shell run first, inside the pod's own mount namespace (``ip netns exec`` makes one): its volumes."""
    return [
        "ip",
        "netns",
        "exec",
        ns,
        "unshare",
        "--uts",
        "--",
        "/bin/sh",
        "-c",
        f'hostname "$0" && {setup}exec "$@"',
        hostname,
    ]
