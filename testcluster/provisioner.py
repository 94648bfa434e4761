"""The test cluster's default StorageClass and its provisioner: each claim of the class gets a folder of
this machine as a ``hostPath`` PersistentVolume, which the real nodes' kubelets mount (they share this
machine's file system), as kind's local-path provisioner does for kind's nodes.

``python -m testcluster.provisioner --kubeconfig K --root DIR [--class NAME]`` runs the loop: every second
it lists the claims, makes a PersistentVolume pre-bound (``claimRef``) to each Pending claim of its class
that has none, with a folder ``DIR/<namespace>-<claim>-<uid>`` that anyone may write (a pod runs as any
user), and deletes the volume and its folder once its claim is gone (``reclaimPolicy: Delete``); the
kube-controller-manager's volume controller does the binding. :func:`volume_for` and :func:`to_reclaim`
are the decisions, pure; the loop is the I/O around them. ``make cluster-up REAL_NODES=1`` starts it with
the class marked default, so a claim that names no class (``examples/quickstart.yaml``'s) gets one.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

NAME = "ddpjob.io/hostpath"
"""The provisioner's name: the StorageClass's ``provisioner`` and the volumes' ``provisioned-by``."""
DEFAULT_CLASS = "standard"  # kind's name for its default class
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
DEFAULT_ANNOTATION = "storageclass.kubernetes.io/is-default-class"


def storage_class(name: str = DEFAULT_CLASS, *, default: bool = True) -> dict[str, Any]:
    """The StorageClass whose claims this provisioner serves (``default``: the cluster's default)."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name, "annotations": {DEFAULT_ANNOTATION: "true" if default else "false"}},
        "provisioner": NAME,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


def volume_name(claim: Mapping[str, Any]) -> str:
    return f"pvc-{claim['metadata']['uid']}"


def volume_for(claim: Mapping[str, Any], class_name: str, root: Path) -> dict[str, Any] | None:
    """The PersistentVolume for ``claim``, or None when it is not this provisioner's to serve (another
    class, already bound, or being deleted)."""
    meta, spec = claim["metadata"], claim.get("spec") or {}
    if spec.get("storageClassName") != class_name or spec.get("volumeName") or meta.get("deletionTimestamp"):
        return None
    if (claim.get("status") or {}).get("phase", "Pending") != "Pending":
        return None
    size = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
    folder = root / f"{meta['namespace']}-{meta['name']}-{meta['uid'][:8]}"
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": volume_name(claim), "annotations": {PROVISIONED_BY: NAME}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": class_name,
            "hostPath": {"path": str(folder), "type": "DirectoryOrCreate"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
        },
    }


def to_reclaim(volumes: Iterable[Mapping[str, Any]], claim_uids: set[str]) -> list[Mapping[str, Any]]:
    """This provisioner's volumes whose claim is gone (Released, or its claim deleted before binding)."""
    out = []
    for volume in volumes:
        meta, spec = volume["metadata"], volume.get("spec") or {}
        if (meta.get("annotations") or {}).get(PROVISIONED_BY) != NAME or meta.get("deletionTimestamp"):
            continue
        released = (volume.get("status") or {}).get("phase") in ("Released", "Failed")
        if released or (spec.get("claimRef") or {}).get("uid") not in claim_uids:
            out.append(volume)
    return out


def run(kubeconfig: str, root: Path, class_name: str, *, every: float = 1.0) -> None:
    from .kubeapi import ApiError, Kube

    kube = Kube(kubeconfig)
    root.mkdir(parents=True, exist_ok=True)
    print(f"provisioner {NAME}: class {class_name}, volumes under {root}", flush=True)
    while True:
        try:
            claims = kube.get("/api/v1/persistentvolumeclaims")["items"]
            for claim in claims:
                if (volume := volume_for(claim, class_name, root)) is None:
                    continue
                folder = Path(volume["spec"]["hostPath"]["path"])
                folder.mkdir(parents=True, exist_ok=True)
                folder.chmod(0o777)  # the pod's user, whichever it is, writes there
                try:
                    kube.create("/api/v1/persistentvolumes", volume)
                    meta = claim["metadata"]
                    print(
                        f"made {volume['metadata']['name']} for {meta['namespace']}/{meta['name']}",
                        flush=True,
                    )
                except ApiError as exc:
                    if exc.status != 409:
                        raise
            uids = {c["metadata"]["uid"] for c in claims}
            for volume in to_reclaim(kube.get("/api/v1/persistentvolumes")["items"], uids):
                name = volume["metadata"]["name"]
                kube.delete(f"/api/v1/persistentvolumes/{name}")
                shutil.rmtree(volume["spec"]["hostPath"]["path"], ignore_errors=True)
                print(f"deleted {name} and its folder", flush=True)
        except (ApiError, OSError) as exc:  # the API server restarting: try again next round
            print(f"provisioner: {exc}", file=sys.stderr, flush=True)
        time.sleep(every)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testcluster.provisioner", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--root", required=True, type=Path, help="the folder that holds the volumes")
    parser.add_argument("--class", dest="class_name", default=DEFAULT_CLASS)
    args = parser.parse_args(argv)
    run(args.kubeconfig, args.root, args.class_name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
