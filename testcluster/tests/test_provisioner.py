"""The default StorageClass's provisioner of `make cluster-up REAL_NODES=1` (testcluster/provisioner.py):
its decisions alone, then the process against the real control plane, whose volume controller binds what it
makes (under a class of its own, not the default, so the suite's other claims are left alone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testcluster import lifecycle, provisioner
from testcluster.fixtures import Cluster, wait_for

ROOT = Path("/volumes")


def _claim(phase: str = "Pending", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "ckpt", "namespace": "team-a", "uid": "0123456789abcdef"},
        "spec": {"storageClassName": "standard", "accessModes": ["ReadWriteMany"], **spec},
        "status": {"phase": phase},
    }


def test_a_pending_claim_of_its_class_gets_a_pre_bound_host_folder_and_no_other_does() -> None:
    volume = provisioner.volume_for(_claim(resources={"requests": {"storage": "2Gi"}}), "standard", ROOT)
    assert volume is not None
    spec = volume["spec"]
    assert spec["hostPath"]["path"] == "/volumes/team-a-ckpt-01234567"
    assert (spec["capacity"], spec["accessModes"]) == ({"storage": "2Gi"}, ["ReadWriteMany"])
    assert spec["claimRef"]["uid"] == "0123456789abcdef" and spec["persistentVolumeReclaimPolicy"] == "Delete"
    assert provisioner.volume_for(_claim(), "other", ROOT) is None
    assert provisioner.volume_for(_claim(volumeName="pvc-x"), "standard", ROOT) is None
    assert provisioner.volume_for(_claim("Bound"), "standard", ROOT) is None


def test_only_its_own_volumes_whose_claim_is_gone_are_reclaimed() -> None:
    mine = provisioner.volume_for(_claim(), "standard", ROOT)
    assert mine is not None
    released = {**mine, "status": {"phase": "Released"}}
    other = {**released, "metadata": {"name": "by-hand", "annotations": {}}}
    assert provisioner.to_reclaim([mine], {"0123456789abcdef"}) == []
    assert provisioner.to_reclaim([mine], set()) == [mine]  # its claim deleted before it was bound
    assert provisioner.to_reclaim([released, other], {"0123456789abcdef"}) == [released]


@pytest.mark.cluster
@pytest.mark.slow
def test_a_claim_is_bound_to_a_writable_folder_and_both_go_with_it(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    name = f"hostpath-{namespace}"
    cluster.kubectl("apply", "-f", "-", input=json.dumps(provisioner.storage_class(name, default=False)))
    env = {**os.environ, "PYTHONPATH": str(lifecycle.PACKAGE_PARENT)}
    argv = ["--kubeconfig", str(cluster.layout.kubeconfig), "--root", str(tmp_path), "--class", name]
    process = subprocess.Popen([sys.executable, "-m", "testcluster.provisioner", *argv], env=env)
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "ckpt"},
        "spec": {
            "storageClassName": name,
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    try:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(claim))

        def bound() -> dict[str, Any] | None:
            got = cluster.kubectl_json("get", "pvc", "ckpt", "-n", namespace)
            return got if got["status"].get("phase") == "Bound" else None

        volume_name = wait_for(bound, what="the claim Bound", timeout=60, every=0.5)["spec"]["volumeName"]
        (folder,) = tmp_path.iterdir()
        assert folder.name.startswith(f"{namespace}-ckpt-") and folder.stat().st_mode & 0o777 == 0o777
        cluster.kubectl("delete", "pvc", "ckpt", "-n", namespace)
        wait_for(
            lambda: cluster.kube.get_or_none(f"/api/v1/persistentvolumes/{volume_name}") is None,
            what=f"PersistentVolume {volume_name} deleted",
            timeout=60,
            every=0.5,
        )
        assert not folder.exists()
    finally:
        process.terminate()
        process.wait(timeout=10)
        cluster.kubectl("delete", "storageclass", name, check=False)
