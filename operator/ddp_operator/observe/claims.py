"""Why the checkpoint claim keeps the pods from starting: the claim as the API server has it and the
events the cluster posted about it → the claim's name, the cause the cluster gives and the fix. Pure.

The API server says little on the claim itself (``status.phase: Pending``, no condition); the causes are in
what the claim lacks (a StorageClass: the cluster has no default one) and in the events the volume controllers
post: the PersistentVolume controller's ``FailedBinding`` and ``ProvisioningFailed`` (with the provisioner's
own message: an access mode its class cannot give, a class that does not exist), and the attach/detach
controller's ``FailedAttachVolume`` on a pod (``Multi-Attach``: a ReadWriteOnce volume already attached to
another node). :mod:`ddp_operator.runtime.reconcile` reads the claim and those events (:func:`claim_to_read`
says when: a job whose pods are not all ready yet), :mod:`ddp_operator.decide.decision` puts the
:class:`Diagnosis` in the ``Ready`` condition, and the phase's event carries it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddp_operator.api import names
from ddp_operator.api.spec_warnings import OBJECT_STORAGE
from ddp_operator.observe.facts import ready

_ACCESS_MODE = re.compile(r"access ?modes?|MULTI_NODE|ReadWriteMany|ReadWriteOnce|RWX", re.IGNORECASE)
_CLASS_NOT_FOUND = re.compile(r'storageclass\.storage\.k8s\.io "([^"]+)" not found')


@dataclass(frozen=True)
class ClaimReading:
    """What the cluster says about the checkpoint claim: the claim (None: it does not exist) and the
    events about it and about the job's pods' volumes (core v1 Events as the API server returns them)."""

    name: str
    claim: Mapping[str, Any] | None
    events: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class Diagnosis:
    """Why the pods wait for their checkpoint volume: a ``Ready`` reason and a message that names the
    claim, the cause and the fix. ``fault``: it will not fix itself (else it is still on its way)."""

    reason: str
    message: str
    fault: bool


def claim_name(job: str) -> str:
    """The claim the operator creates for ``spec.checkpoint.volumeClaimTemplate``."""
    return f"{job}{names.CHECKPOINT_CLAIM_SUFFIX}"


def claim_of(body: Mapping[str, Any]) -> tuple[str, bool] | None:
    """The claim a DDPJob's checkpoints live on and whether the operator made it (from its
    volumeClaimTemplate) rather than the user (``volume: {persistentVolumeClaim: ...}``); None: no claim."""
    checkpoint = (body.get("spec") or {}).get("checkpoint") or {}
    if "volumeClaimTemplate" in checkpoint:
        return claim_name(body["metadata"]["name"]), True
    user = ((checkpoint.get("volume") or {}).get("persistentVolumeClaim") or {}).get("claimName")
    return (str(user), False) if user else None


def claim_to_read(body: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> str | None:
    """The claim whose state the next decision needs: the DDPJob's, while fewer of its pods are ready
    than it has nodes and it has not finished (once they all run, the claim is working)."""
    found = claim_of(body)
    status = body.get("status") or {}
    if found is None or status.get("phase") in ("Succeeded", "Failed", "Suspended"):
        return None
    nodes = (body.get("spec") or {}).get("nodes", 1)
    return found[0] if sum(1 for pod in pods if ready(pod)) < nodes else None


def _newest(
    events: Sequence[Mapping[str, Any]], kind: str, reasons: Sequence[str]
) -> Mapping[str, Any] | None:
    """The newest event of ``reasons`` about an object of ``kind``."""
    found = [
        e
        for e in events
        if e.get("reason") in reasons and (e.get("involvedObject") or {}).get("kind") == kind
    ]
    stamp = lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or "")  # noqa: E731
    return max(found, key=stamp) if found else None


def diagnose(reading: ClaimReading | None, owned: bool, nodes: int = 1) -> Diagnosis | None:
    """Why the pods cannot have the claim, or None when nothing about the claim keeps them (it is bound
    and attached, or there is no claim). ``owned``: the operator made the claim from
    spec.checkpoint.volumeClaimTemplate (the fix is in the DDPJob), else it is the user's own."""
    if reading is None:
        return None
    name, claim = reading.name, reading.claim
    field = "spec.checkpoint.volumeClaimTemplate" if owned else f"your PersistentVolumeClaim {name}"
    if claim is None:
        if owned:
            return None  # created by this reconcile; the next one reads it
        return Diagnosis(
            "ClaimNotFound",
            f"PersistentVolumeClaim {name} (spec.checkpoint.volume) does not exist: create it, or give "
            "spec.checkpoint.volumeClaimTemplate so that the operator creates one",
            True,
        )
    phase = (claim.get("status") or {}).get("phase", "Pending")
    if phase == "Bound":
        return _attach(reading, nodes)
    if phase == "Lost":
        return Diagnosis(
            "ClaimLost",
            f"PersistentVolumeClaim {name} is Lost: its PersistentVolume is gone, with the checkpoints on "
            f"it; delete the claim{' (the operator creates a new one)' if owned else ''} or restore the "
            "volume",
            True,
        )
    return _pending(reading, field, owned)


def _pending(reading: ClaimReading, field: str, owned: bool) -> Diagnosis:
    name, claim = reading.name, reading.claim or {}
    spec = claim.get("spec") or {}
    modes = list(spec.get("accessModes") or [])
    storage_class = spec.get("storageClassName") or '""'
    size = (spec.get("resources") or {}).get("requests", {}).get("storage", "?")
    failed = _newest(reading.events, "PersistentVolumeClaim", ("ProvisioningFailed", "FailedBinding"))
    said = str(failed.get("message", "")).strip() if failed else ""
    if said and (found := _CLASS_NOT_FOUND.search(said)):
        return Diagnosis(
            "StorageClassNotFound",
            f"PersistentVolumeClaim {name} cannot be provisioned: StorageClass {found[1]} does not exist; "
            f"set {field}'s storageClassName to one that `kubectl get storageclass` lists",
            True,
        )
    if failed and failed.get("reason") == "ProvisioningFailed" and _ACCESS_MODE.search(said):
        return Diagnosis(
            "AccessModeUnsupported",
            f"PersistentVolumeClaim {name} cannot be provisioned: the provisioner cannot give access mode "
            f"{modes} ({said}); ask for [ReadWriteOnce] (pods on one node), or a storageClassName whose "
            f"class gives ReadWriteMany (NFS, EFS, Filestore, CephFS), or use {OBJECT_STORAGE}",
            True,
        )
    if failed and failed.get("reason") == "ProvisioningFailed":
        return Diagnosis(
            "ProvisioningFailed",
            f"PersistentVolumeClaim {name} cannot be provisioned: {said}; fix the StorageClass's provisioner "
            f"or pick another storageClassName in {field}",
            True,
        )
    if "storageClassName" not in spec and not spec.get("volumeName"):
        # The API server's DefaultStorageClass admission sets the default class on a claim without one
        # (and the volume controller sets it later when a default appears): none means none exists.
        where = (
            f"set {field}.storageClassName to one that `kubectl get storageclass` lists"
            if owned
            else (f"set storageClassName on {name} to one that `kubectl get storageclass` lists")
        )
        return Diagnosis(
            "NoStorageClass",
            f"PersistentVolumeClaim {name} is not bound: it names no StorageClass and the cluster has no "
            f"default one{f' ({said})' if said else ''}; {where}, mark a class as the default, create a "
            f"PersistentVolume for it ({'/'.join(modes)}), or use {OBJECT_STORAGE}",
            True,
        )
    if failed is not None:  # FailedBinding with a class: no volume of that class matches the claim
        return Diagnosis(
            "ClaimUnbound",
            f"PersistentVolumeClaim {name} is not bound: {said}; create a PersistentVolume of StorageClass "
            f"{storage_class} that matches it ({'/'.join(modes)}, {size}), or pick another storageClassName "
            f"in {field}",
            True,
        )
    waiting = _newest(
        reading.events,
        "PersistentVolumeClaim",
        ("ExternalProvisioning", "WaitForFirstConsumer", "Provisioning"),
    )
    detail = f": {str(waiting.get('message', '')).strip()}" if waiting else ""
    return Diagnosis(
        "ClaimPending",
        f"waiting for PersistentVolumeClaim {name} (StorageClass {storage_class}) to be bound{detail}",
        False,
    )


def _attach(reading: ClaimReading, nodes: int) -> Diagnosis | None:
    """A bound claim whose volume a pod cannot attach: ``Multi-Attach`` (ReadWriteOnce on two nodes)."""
    failed = _newest(reading.events, "Pod", ("FailedAttachVolume",))
    if failed is None:
        return None
    pod = (failed.get("involvedObject") or {}).get("name", "?")
    said = str(failed.get("message", "")).strip()
    modes = list(((reading.claim or {}).get("spec") or {}).get("accessModes") or [])
    if "Multi-Attach" in said or "exclusively attached" in said:
        return Diagnosis(
            "MultiAttach",
            f"pod {pod} cannot attach PersistentVolumeClaim {reading.name}: its volume is {modes} and "
            f"already attached to another node ({said}); for {nodes} pods on several nodes use a "
            f"storageClassName whose class gives ReadWriteMany, or {OBJECT_STORAGE}",
            True,
        )
    return Diagnosis(
        "FailedAttachVolume",
        f"pod {pod} cannot attach PersistentVolumeClaim {reading.name}: {said}; see `kubectl describe pod "
        f"{pod}` and the volume's CSI driver",
        True,
    )
