"""The operator's peering keeper (runtime/keeper.Keeper) against the real API server: it renews its own
record in a KopfPeering by JSON patch, never puts back a record that was removed (Kopf removes its own at
shutdown), and fences itself when it cannot renew."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from ddp_operator.runtime import keeper as leases
from ddp_operator.runtime import peering
from helpers.e2e import Operator
from testcluster.fixtures import Cluster, wait_for

pytestmark = [pytest.mark.cluster]

OWN = "op-0/20261129010000/xyz"


def _records(cluster: Cluster, namespace: str) -> dict[str, Any]:
    body = cluster.kubectl_json("get", "kopfpeering", peering.NAME, "-n", namespace)
    return dict(body.get("status") or {})


def test_the_keeper_renews_its_record_never_restores_a_removed_one_and_fences_when_it_cannot_renew(
    cluster: Cluster, operator: Operator, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(``operator``: the session's, which installed the CRDs, Kopf's peering ones among them.)"""
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    claimed = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=3)).isoformat()
    peering_object = {
        "apiVersion": "kopf.dev/v1",
        "kind": "KopfPeering",
        "metadata": {"name": peering.NAME, "namespace": namespace},
        "status": {OWN: {"priority": 5, "lifetime": 6, "lastseen": claimed}},
    }
    cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(peering_object))
    if not _records(cluster, namespace):  # status is a plain field of Kopf's CRD, but say it if not kept
        pytest.fail(f"the KopfPeering kept no status: {cluster.kubectl_json('get', 'kopfpeering', '-A')}")
    keeper = leases.Keeper([namespace], OWN, 5, lifetime=6, every=0.2)
    keeper.start()
    try:
        renewed = wait_for(
            lambda: (seen := _records(cluster, namespace)[OWN]["lastseen"]) > claimed and seen,
            what="the keeper's renewal of its record",
            timeout=20,
        )
        record = _records(cluster, namespace)[OWN]
        assert (record["priority"], record["lifetime"]) == (5, 6), record  # only lastseen changes
        assert not keeper.fenced.is_set()
        # the record removed, as Kopf does at shutdown (a merge patch of null): never put back
        cluster.kubectl(
            "patch",
            "kopfpeering",
            peering.NAME,
            "-n",
            namespace,
            "--type=merge",
            "-p",
            json.dumps({"status": {OWN: None}}),
        )
        wait_for(lambda: keeper.fenced.is_set(), what="the keeper fenced (1 s without a renewal)", timeout=20)
        assert OWN not in _records(cluster, namespace), (renewed, _records(cluster, namespace))
    finally:
        keeper.stop()
