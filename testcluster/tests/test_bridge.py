"""The test cluster's pod bridge keeps the gateway where pods last found it (:data:`netns.BRIDGE_MAC`):
every pod's connection to the API server and to CoreDNS depends on it. A Linux bridge whose address was
never set takes the lowest MAC of its ports, so each pod that came or went could move it; pods then sent
to the old MAC for 15-18 s (their ARP entry for the gateway) and an operator replica's requests timed out
while its peer's went through.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from testcluster import netns
from testcluster.fixtures import Cluster

pytestmark = [pytest.mark.cluster]


def _mac(link: str) -> str:
    return Path(f"/sys/class/net/{link}/address").read_text().strip()


def test_the_pod_bridge_keeps_its_address_when_a_pod_with_a_lower_one_joins_and_leaves(
    cluster: Cluster,
) -> None:
    assert cluster  # the cluster made the bridge
    assert _mac(netns.BRIDGE) == netns.BRIDGE_MAC
    host, peer = f"tmac{uuid.uuid4().hex[:6]}", f"tmap{uuid.uuid4().hex[:6]}"
    # the lowest unicast MAC there is: a bridge that follows its ports would take it
    subprocess.run(
        ["ip", "link", "add", host, "address", "00:00:00:00:00:01", "type", "veth", "peer", "name", peer],
        check=True,
    )
    try:
        subprocess.run(["ip", "link", "set", host, "master", netns.BRIDGE, "up"], check=True)
        assert _mac(netns.BRIDGE) == netns.BRIDGE_MAC
    finally:
        subprocess.run(["ip", "link", "delete", host], check=True)
    assert _mac(netns.BRIDGE) == netns.BRIDGE_MAC
