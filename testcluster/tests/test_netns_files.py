"""What a pod's network namespace is given (resolv.conf, hosts, addresses), without creating one."""

from __future__ import annotations

from testcluster.kubeletapi import tail_lines
from testcluster.netns import hosts_file, netns_name, resolv_conf
from testcluster.nodeagent import IPAllocator


def test_resolv_conf_is_cluster_first() -> None:
    assert resolv_conf("team-a").splitlines() == [
        "search team-a.svc.cluster.local svc.cluster.local cluster.local",
        "nameserver 10.96.0.10",
        "options ndots:5",
    ]


def test_hosts_file_names_the_pod_by_its_fqdn() -> None:
    text = hosts_file("10.244.1.2", "job-0", "job-0.svc.team-a.svc.cluster.local")
    assert "10.244.1.2\tjob-0.svc.team-a.svc.cluster.local\tjob-0\n" in text
    assert "127.0.0.1\tlocalhost" in text


def test_netns_names_fit_and_differ() -> None:
    a, b = netns_name("0b9f4f1e-aaaa-bbbb"), netns_name("0b9f4f1e-aaab-bbbb")
    assert a != b and a.startswith("ddpjob-")


def test_pod_ips_come_from_the_node_cidr_and_are_reused() -> None:
    ips = IPAllocator("10.244.2.0/24")
    first, second = ips.take(), ips.take()
    assert (first, second) == ("10.244.2.2", "10.244.2.3")
    ips.give_back(first)
    rest = [ips.take() for _ in range(252)]  # .4 … .254, then the released .2 last
    assert rest[0] == "10.244.2.4" and rest[-1] == first and len(set(rest)) == 252


def test_tail_lines() -> None:
    assert tail_lines(b"a\nb\nc\n", 2) == b"b\nc\n"
    assert tail_lines(b"a\nb", 0) == b""
