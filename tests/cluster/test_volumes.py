"""The node agent gives pods their volumes as the kubelet does: its own emptyDir per pod, hostPath as is,
a PersistentVolumeClaim as the folder of the PV the real controller-manager bound it to."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from .fixtures import Cluster, host_path_volume, python_pod
from .volumes import Mount, VolumeError, mounts, shell_prefix

WRITE = """
import os, pathlib, sys
path = pathlib.Path("/data/seen")
before = path.read_text() if path.exists() else ""
path.write_text(before + sys.argv[1] + "\\n")
open(os.environ["DDPJOB_TERMINATION_LOG"], "w").write(path.read_text().replace("\\n", " ").strip())
"""


def _writer(name: str, volume: dict[str, Any]) -> dict[str, Any]:
    pod = python_pod(name, WRITE, volumes=[{"name": "data", **volume}])
    container = pod["spec"]["containers"][0]
    container["args"] = [name]
    container["command"] = ["python", "-c", WRITE]
    container["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    return pod


def _message(cluster: Cluster, namespace: str, name: str) -> str:
    cluster.kubectl(
        "wait", "-n", namespace, f"pod/{name}", "--for=jsonpath={.status.phase}=Succeeded", "--timeout=90s"
    )
    state = cluster.pod(namespace, name)["status"]["containerStatuses"][0]["state"]["terminated"]
    return str(state.get("message", ""))


def _run_two(cluster: Cluster, namespace: str, volume: dict[str, Any]) -> tuple[str, str]:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(_writer("first", volume)))
    first = _message(cluster, namespace, "first")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(_writer("second", volume)))
    return first, _message(cluster, namespace, "second")


@pytest.mark.cluster
def test_each_pod_gets_its_own_empty_dir(cluster: Cluster, namespace: str) -> None:
    assert _run_two(cluster, namespace, {"emptyDir": {}}) == ("first", "second")
    assert not Path("/data/seen").exists(), "the mount leaked into the host's mount namespace"


@pytest.mark.cluster
def test_host_path_is_the_hosts_folder(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    assert _run_two(cluster, namespace, {"hostPath": {"path": str(tmp_path)}}) == ("first", "first second")
    assert (tmp_path / "seen").read_text() == "first\nsecond\n"


@pytest.mark.cluster
def test_a_claim_mounts_the_volume_it_is_bound_to(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    storage_class = f"test-{namespace}"
    pv = host_path_volume(f"pv-{namespace}", storage_class, str(tmp_path))
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "claim"},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": storage_class,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pv))
    try:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(claim))
        cluster.kubectl(
            "wait", "-n", namespace, "pvc/claim", "--for=jsonpath={.status.phase}=Bound", "--timeout=60s"
        )
        volume = {"persistentVolumeClaim": {"claimName": "claim"}}
        assert _run_two(cluster, namespace, volume) == ("first", "first second")
        assert (tmp_path / "seen").read_text() == "first\nsecond\n"
    finally:
        cluster.kubectl("delete", "-n", namespace, "pod", "--all", "--wait=true")
        cluster.kubectl("delete", "-n", namespace, "pvc", "claim", "--wait=true")
        cluster.kubectl("delete", "pv", f"pv-{namespace}", "--wait=false")


POD = {
    "volumes": [
        {"name": "scratch", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "data", "hostPath": {"path": "/srv/data"}},
        {"name": "ckpt", "persistentVolumeClaim": {"claimName": "c"}},
        {"name": "conf", "configMap": {"name": "x"}},
    ]
}


def test_mounts_map_every_volume_kind() -> None:
    container = {
        "volumeMounts": [
            {"name": "scratch", "mountPath": "/scratch"},
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "data", "mountPath": "/data", "readOnly": True},
            {"name": "ckpt", "mountPath": "/checkpoints", "subPath": "job"},
            {"name": "conf", "mountPath": "/etc/conf"},
        ]
    }
    pv = {"metadata": {"name": "pv"}, "spec": {"hostPath": {"path": "/pv"}}}
    got = mounts(POD, container, Path("/pods/p"), lambda claim: pv if claim == "c" else None)
    assert got == [
        Mount(Path("/pods/p/volumes/scratch"), "/scratch"),
        Mount(Path("/srv/data"), "/data", read_only=True),
        Mount(Path("/pv/job"), "/checkpoints"),
        Mount(Path("/pods/p/volumes/conf"), "/etc/conf"),  # its files written there first (projected.py)
    ]
    assert shell_prefix(got[1:2]) == (
        'if [ -f /srv/data ]; then mkdir -p "$(dirname /data)" && { [ -e /data ] || touch /data; }; '
        "else mkdir -p /srv/data /data; fi && mount --bind /srv/data /data && "
        "mount -o remount,bind,ro /data && "
    )


def test_an_unbound_claim_or_a_missing_volume_is_an_error() -> None:
    with pytest.raises(VolumeError, match="'c' is not bound"):
        mounts(POD, {"volumeMounts": [{"name": "ckpt", "mountPath": "/c"}]}, Path("/p"), lambda claim: None)
    with pytest.raises(VolumeError, match="names no volume"):
        mounts(POD, {"volumeMounts": [{"name": "nope", "mountPath": "/c"}]}, Path("/p"), lambda claim: None)


READ_GZIP = """
import gzip, os
path = "/etc/app/config.yaml.gz"
text = gzip.decompress(open(path, "rb").read()).decode()
open(os.environ["DDPJOB_TERMINATION_LOG"], "w").write(text + "|" + str(os.path.isfile(path)))
"""


@pytest.mark.cluster
def test_a_binary_secret_key_mounts_by_sub_path_as_a_file(cluster: Cluster, namespace: str) -> None:
    """What the Prometheus Operator's pods need: a gzipped config in a Secret, bytes intact, mounted as one
    file (``subPath``) at a path whose folder the host lacks."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "conf"},
        "data": {"config.yaml.gz": base64.b64encode(gzip.compress(b"scrape: every 2s")).decode()},
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(secret))
    pod = python_pod("reader", READ_GZIP, volumes=[{"name": "conf", "secret": {"secretName": "conf"}}])
    container = pod["spec"]["containers"][0]
    container["command"] = ["python", "-c", READ_GZIP]
    container["volumeMounts"] = [
        {
            "name": "conf",
            "mountPath": "/etc/app/config.yaml.gz",
            "subPath": "config.yaml.gz",
            "readOnly": True,
        }
    ]
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))
    assert _message(cluster, namespace, "reader") == "scrape: every 2s|True"
