"""The checkpoint claim's diagnosis: each cause the cluster gives, as the API server and the volume
controllers word it, becomes the claim's name, the cause and the fix (observe/claims.py); and when it is
read."""

from __future__ import annotations

from typing import Any

import pytest

from ddp_operator.observe.claims import ClaimReading, claim_of, claim_to_read, diagnose

NAME = "quickstart-checkpoints"


def _claim(phase: str = "Pending", **spec: Any) -> dict[str, Any]:
    spec = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, **spec}
    return {"metadata": {"name": NAME}, "spec": spec, "status": {"phase": phase}}


def _event(
    reason: str, message: str, kind: str = "PersistentVolumeClaim", name: str = NAME, at: str = ""
) -> dict[str, Any]:
    return {
        "reason": reason,
        "message": message,
        "type": "Warning",
        "involvedObject": {"kind": kind, "name": name},
        "lastTimestamp": at or "2026-11-24T08:00:00Z",
    }


# (claim, events, owned) → (reason, words the message must hold)
CASES = {
    "no default class (the test control plane, a bare cluster)": (
        _claim(),
        [
            _event(
                "FailedBinding", "no persistent volumes available for this claim and no storage class is set"
            )
        ],
        True,
        "NoStorageClass",
        ["no default one", "storageClassName", "spec.checkpoint.volumeClaimTemplate", "spec.checkpoint.s3"],
    ),
    "no default class, before any event": (_claim(), [], True, "NoStorageClass", ["no default one"]),
    "kind's local-path refuses ReadWriteMany": (
        _claim(storageClassName="standard", accessModes=["ReadWriteMany"]),
        [
            _event(
                "ProvisioningFailed",
                'failed to provision volume with StorageClass "standard": '
                "Only support ReadWriteOnce access mode",
            )
        ],
        True,
        "AccessModeUnsupported",
        ["['ReadWriteMany']", "Only support ReadWriteOnce access mode", "[ReadWriteOnce]", "ReadWriteMany"],
    ),
    "EBS CSI refuses MULTI_NODE_MULTI_WRITER": (
        _claim(storageClassName="gp3", accessModes=["ReadWriteMany"]),
        [
            _event(
                "ProvisioningFailed",
                'failed to provision volume with StorageClass "gp3": rpc error: code = InvalidArgument '
                "desc = Volume capabilities MULTI_NODE_MULTI_WRITER not supported. "
                "Only AccessModes[ReadWriteOnce] supported.",
            )
        ],
        True,
        "AccessModeUnsupported",
        ["MULTI_NODE_MULTI_WRITER"],
    ),
    "a class that does not exist": (
        _claim(storageClassName="fast"),
        [_event("ProvisioningFailed", 'storageclass.storage.k8s.io "fast" not found')],
        True,
        "StorageClassNotFound",
        ["StorageClass fast does not exist", "kubectl get storageclass"],
    ),
    "the provisioner's own failure": (
        _claim(storageClassName="ceph"),
        [_event("ProvisioningFailed", "failed to provision volume: quota exceeded for pool rbd")],
        True,
        "ProvisioningFailed",
        ["quota exceeded for pool rbd", "storageClassName"],
    ),
    "a class without a provisioner and no matching volume": (
        _claim(storageClassName="manual"),
        [
            _event(
                "FailedBinding", "no persistent volumes available for this claim and no storage class is set"
            )
        ],
        True,
        "ClaimUnbound",
        ["create a PersistentVolume of StorageClass manual", "ReadWriteOnce, 1Gi"],
    ),
    "still provisioning: waiting, not a fault": (
        _claim(storageClassName="standard"),
        [
            _event(
                "ExternalProvisioning",
                "Waiting for a volume to be created either by the external provisioner "
                "'rancher.io/local-path'",
            )
        ],
        True,
        "ClaimPending",
        ["waiting for PersistentVolumeClaim", "rancher.io/local-path"],
    ),
    "the user's own claim does not exist": (None, [], False, "ClaimNotFound", ["spec.checkpoint.volume"]),
    "the user's claim without a class": (
        _claim(),
        [],
        False,
        "NoStorageClass",
        [f"set storageClassName on {NAME}"],
    ),
    "Multi-Attach: ReadWriteOnce on a second node": (
        _claim("Bound", storageClassName="gp3"),
        [
            _event(
                "FailedAttachVolume",
                'Multi-Attach error for volume "pvc-1234" Volume is already used by pod(s) '
                "quickstart-1-0-abcde",
                kind="Pod",
                name="quickstart-1-1-fghij",
            )
        ],
        True,
        "MultiAttach",
        ["quickstart-1-1-fghij", "['ReadWriteOnce']", "ReadWriteMany", "spec.checkpoint.s3"],
    ),
    "the claim's volume is gone": (_claim("Lost"), [], True, "ClaimLost", ["is Lost"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_cause_names_the_claim_the_cause_and_the_fix(case: str) -> None:
    claim, events, owned, reason, words = CASES[case]
    found = diagnose(ClaimReading(NAME, claim, tuple(events)), owned=owned, nodes=2)
    assert found is not None, case
    assert found.reason == reason, found
    assert NAME in found.message, found.message
    for word in words:
        assert word in found.message, (word, found.message)
    assert found.fault == (reason != "ClaimPending")


def test_a_bound_attached_claim_and_a_claim_being_created_say_nothing() -> None:
    assert diagnose(ClaimReading(NAME, _claim("Bound"), ()), owned=True) is None
    assert diagnose(ClaimReading(NAME, None, ()), owned=True) is None  # the operator creates it now
    assert diagnose(None, owned=True) is None


def test_the_newest_event_decides() -> None:
    older = _event("ProvisioningFailed", "quota exceeded", at="2026-11-24T08:00:00Z")
    newer = _event(
        "ProvisioningFailed", 'storageclass.storage.k8s.io "x" not found', at="2026-11-24T08:01:00Z"
    )
    found = diagnose(ClaimReading(NAME, _claim(storageClassName="x"), (newer, older)), owned=True)
    assert found is not None and found.reason == "StorageClassNotFound"


def _body(checkpoint: dict[str, Any], phase: str = "Pending", nodes: int = 2) -> dict[str, Any]:
    return {
        "metadata": {"name": "quickstart", "namespace": "ns"},
        "spec": {"nodes": nodes, "checkpoint": checkpoint},
        "status": {"phase": phase},
    }


def _pod(is_ready: bool) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True"}] if is_ready else []
    return {"status": {"phase": "Running" if is_ready else "Pending", "conditions": conditions}}


def test_the_claim_is_read_only_while_pods_wait_for_it() -> None:
    template = {"volumeClaimTemplate": {"size": "1Gi"}}
    assert claim_of(_body(template)) == (NAME, True)
    user = {"volume": {"persistentVolumeClaim": {"claimName": "mine"}}}
    assert claim_of(_body(user)) == ("mine", False)
    assert claim_of(_body({"volume": {"hostPath": {"path": "/x"}}})) is None
    assert claim_to_read(_body(template), [_pod(True), _pod(False)]) == NAME
    assert claim_to_read(_body(template), []) == NAME
    assert claim_to_read(_body(template), [_pod(True), _pod(True)]) is None
    assert claim_to_read(_body(template, phase="Succeeded"), []) is None
