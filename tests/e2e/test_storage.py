"""The quickstart's checkpoint claim on the real control plane, which has no StorageClass (a bare
cluster): as it is, the claim cannot bind and the status and an Event say so within seconds, naming the
claim, the cause and the fix. (With a ReadWriteOnce volume such as a default class gives, the quickstart
succeeds: tests/e2e/test_real_nodes.py, where the kubelets mount it.)"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml

from helpers.e2e import REPO, Operator, get
from testcluster.fixtures import Cluster, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

CLAIM = "quickstart-checkpoints"


def _quickstart() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    doc["spec"]["trainer"].update(steps=40, checkpointEvery=20)
    doc["spec"]["syncCheck"]["everySteps"] = 20
    return doc


def _apply(cluster: Cluster, namespace: str, doc: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))


def _ready(cluster: Cluster, namespace: str) -> dict[str, Any]:
    conditions = get(cluster, namespace, "quickstart").get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Ready"), {})


def test_the_quickstart_on_a_cluster_without_a_storage_class_says_which_claim_waits_and_why(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    started = time.monotonic()
    _apply(cluster, namespace, _quickstart())
    ready = wait_for(
        lambda: (found := _ready(cluster, namespace)).get("reason") == "NoStorageClass" and found,
        what="the Ready condition to diagnose the unbound claim",
        timeout=60,
        every=0.5,
    )
    took = time.monotonic() - started
    print(f"diagnosed {took:.1f}s after kubectl apply: {ready['message']}")
    assert CLAIM in ready["message"] and "no default one" in ready["message"], ready
    assert "storageClassName" in ready["message"], ready  # the fix
    assert get(cluster, namespace, "quickstart")["status"]["phase"] == "Pending"
    # the Event is posted beside the status write, not before it: waited for, as the status was
    events = wait_for(
        lambda: cluster.kubectl_json(
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            "involvedObject.kind=DDPJob,reason=NoStorageClass",
        )["items"],
        what="the NoStorageClass Event",
        timeout=30,
        every=0.5,
    )
    assert events[0]["type"] == "Warning" and CLAIM in events[0]["message"], events
