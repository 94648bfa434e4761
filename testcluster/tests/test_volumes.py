"""The node agent gives pods their volumes as the kubelet does: its own emptyDir per pod, and the files of
Secret, ConfigMap and projected volumes; hostPaths and claims are for the real nodes."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from testcluster.fixtures import Cluster, python_pod
from testcluster.volumes import Mount, VolumeError, mounts, shell_prefix

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
            {"name": "scratch", "mountPath": "/scratch", "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "conf", "mountPath": "/etc/conf/app.yaml", "subPath": "app.yaml"},
        ]
    }
    got = mounts(POD, container, Path("/pods/p"))
    assert got == [
        Mount(Path("/pods/p/volumes/scratch"), "/scratch", read_only=True),
        # its files written there first (projected.py); /dev/shm keeps the host's shared memory
        Mount(Path("/pods/p/volumes/conf/app.yaml"), "/etc/conf/app.yaml"),
    ]
    src = "/pods/p/volumes/scratch"
    assert shell_prefix(got[:1]) == (
        f'if [ -f {src} ]; then mkdir -p "$(dirname /scratch)" && {{ [ -e /scratch ] || touch /scratch; }}; '
        f"else mkdir -p {src} /scratch; fi && mount --bind {src} /scratch && "
        "mount -o remount,bind,ro /scratch && "
    )


@pytest.mark.parametrize("name", ["data", "ckpt"])
def test_host_paths_claims_and_missing_volumes_are_errors(name: str) -> None:
    """A hostPath or a claim: the real nodes' kubelets mount those, not the agents."""
    with pytest.raises(VolumeError, match=f"volume '{name}' is a .*put the pod on a real node"):
        mounts(POD, {"volumeMounts": [{"name": name, "mountPath": "/c"}]}, Path("/p"))
    with pytest.raises(VolumeError, match="names no volume"):
        mounts(POD, {"volumeMounts": [{"name": "nope", "mountPath": "/c"}]}, Path("/p"))


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
