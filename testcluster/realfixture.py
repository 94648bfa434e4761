"""Real nodes for tests: ``running_real_nodes`` joins ``real-1`` and ``real-2`` (:mod:`realnode`) to the
running test cluster, with ``make images``' operator and trainer images and the sandbox image imported, and
takes them out again: pods on them deleted (the kubelet stops their containers and releases their
addresses), Node objects deleted, kubelet and containerd stopped. Tests take them through the session
fixture :func:`real_nodes` (one start per session, whichever tier asks first: two starts would fight over
the nodes' containerd), which skips, saying why, where they cannot run (fails instead in CI: ``CI=true``,
:func:`ci.skip_or_fail`).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import nodeimages, realnode
from .ci import skip_or_fail
from .fixtures import Cluster, wait_for
from .layout import BUILD_SCRIPT
from .nodeconfig import LABEL, RealNode

IMAGES = {"operator": "docker.io/ddpjob/operator:0.1.0", "trainer": "docker.io/ddpjob/trainer:0.1.0"}
TOLERATION = {"key": LABEL, "operator": "Exists", "effect": "NoSchedule"}
# while an image is imported: content store (the archive's blobs) + overlay snapshots (~1.9x); afterwards
# only the snapshots stay (nodeimages.drop_layer_blobs), and they replace the node's older copy, if any
UNPACKED_PER_ARCHIVE_BYTE = 1.9
DISK_MARGIN = 3 * 1024**3


def on_node(node: str) -> dict[str, object]:
    """Pod spec fields that put a pod on real node ``node``."""
    return {"nodeSelector": {LABEL: "true", "kubernetes.io/hostname": node}, "tolerations": [TOLERATION]}


def unavailable_reason(archives: dict[str, Path] | str) -> str | None:
    for tool in ("containerd", "ctr", "runc"):
        if not shutil.which(tool):
            return f"real nodes need {tool}: apt-get install containerd runc"
    if not Path("/usr/lib/cni/bridge").exists():
        return "real nodes need the CNI plugins: apt-get install containernetworking-plugins"
    if isinstance(archives, str):
        return archives
    return None


def _disk_reason(nodes: list[RealNode], archives: dict[str, Path]) -> str | None:
    """Why the images would not fit on the disk, or None. The imports run one after another: each needs
    its archive's blobs for a moment, and keeps its snapshots (~1.9x the archive) where the node held no
    copy of that image (an older copy is deleted first: ``nodeimages.import_image``)."""
    kept, moment = 0, 0
    for node in nodes:
        for archive in archives.values():
            if _holds(node, archive):
                continue
            moment = max(moment, archive.stat().st_size)
            if not any(node.containerd_root.glob(f"imported-*-{archive.name}")):
                kept += int(archive.stat().st_size * UNPACKED_PER_ARCHIVE_BYTE)
    need = kept + moment
    root = nodes[0].containerd_root
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    if need and free - need < DISK_MARGIN:
        return f"the images need ~{need / 1e9:.1f} GB on {root}'s disk and {free / 1e9:.1f} GB are free"
    return None


def _holds(node: RealNode, archive: Path) -> bool:
    """Whether the node imported ``archive`` (a marker beside its images; for the disk estimate only)."""
    marker = node.containerd_root / f"imported-{archive.parent.name}-{archive.name}"
    return marker.exists()


def _import(node: RealNode, archive: Path, name: str) -> None:
    nodeimages.import_image(node.socket, archive, name)
    # an archive of another build (a changed input hash) replaces the node's copy of that image
    for stale in node.containerd_root.glob(f"imported-*-{archive.name}"):
        stale.unlink()
    (node.containerd_root / f"imported-{archive.parent.name}-{archive.name}").touch()


def bring_up(cluster: Cluster, bin_dir: Path) -> list[RealNode]:
    """Starts the real nodes (containerd and a kubelet each), gives them the images and waits until their
    Nodes are Ready; raises :class:`Unavailable`, saying why, where this machine cannot run them."""
    archives = nodeimages.image_archives()
    reason = unavailable_reason(archives)
    if reason:
        raise Unavailable(reason)
    assert isinstance(archives, dict)
    nodes = realnode.nodes(cluster.layout)
    reason = _disk_reason(nodes, archives)
    if reason:
        raise Unavailable(reason)
    pause = nodeimages.write_pause_archive(bin_dir / "pause", cluster.layout.root / "pause.tar")
    started = time.monotonic()
    for node in nodes:
        realnode.write_configs(node)
        realnode.start(node, bin_dir)
    for node in nodes:
        nodeimages.import_image(node.socket, pause, nodeimages.PAUSE_IMAGE)
        for target, archive in archives.items():
            _import(node, archive, IMAGES[target])  # a no-op for an image the node holds
            nodeimages.drop_layer_blobs(node.socket, IMAGES[target])
    for node in nodes:
        wait_for(
            lambda n=node: cluster.kube.get_or_none(f"/api/v1/nodes/{n.name}"),
            what=f"Node {node.name} registered",
            timeout=60,
        )
        cluster.kubectl("wait", "--for=condition=Ready", f"node/{node.name}", "--timeout=120s")
    print(f"real nodes {', '.join(n.name for n in nodes)} Ready in {time.monotonic() - started:.1f} s")
    return nodes


@contextlib.contextmanager
def running_real_nodes(cluster: Cluster, bin_dir: Path) -> Iterator[list[RealNode]]:
    nodes = realnode.nodes(cluster.layout)
    try:
        yield bring_up(cluster, bin_dir)
    finally:
        _take_out(cluster, nodes)


def _take_out(cluster: Cluster, nodes: list[RealNode]) -> None:
    for node in nodes:
        pods = cluster.kube.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node.name}")["items"]
        for pod in pods:
            meta = pod["metadata"]
            with contextlib.suppress(Exception):
                cluster.kube.delete(
                    f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", {"gracePeriodSeconds": 1}
                )
    for node in nodes:
        with contextlib.suppress(AssertionError):
            wait_for(
                lambda n=node: (
                    not cluster.kube.get("/api/v1/pods", fieldSelector=f"spec.nodeName={n.name}")["items"]
                ),
                what=f"the pods of {node.name} to go",
                timeout=60,
            )
    for node in nodes:
        with contextlib.suppress(Exception):
            cluster.kube.delete(f"/api/v1/nodes/{node.name}")
        realnode.stop(node)
        realnode.cleanup_cgroups(node)


def host_pid(node: RealNode, container_id: str) -> int:
    """The host PID of a container's main process (``containerd://<id>``), as its node's containerd says."""
    cid = container_id.removeprefix("containerd://")
    for line in nodeimages.ctr(node.socket, "tasks", "ls").splitlines()[1:]:
        task, pid, *_ = line.split()
        if task == cid:
            return int(pid)
    raise AssertionError(f"containerd of {node.name} runs no task {cid}")


def lose_node(node: RealNode) -> None:
    """Node ``node`` drops dead: its kubelet stops renewing its Lease, its containers are killed and its
    containerd stops; its Pods stay in the API as they were (``restore_node`` brings it back)."""
    realnode.stop(node)


def restore_node(cluster: Cluster, node: RealNode) -> None:
    """Starts a lost node's containerd and kubelet again (its images are still there) and waits for it
    to be Ready; the kubelet then finishes what the API asks of the pods its predecessor ran."""
    built = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=True)
    realnode.start(node, Path(built.stdout.strip()))
    cluster.kubectl("wait", "--for=condition=Ready", f"node/{node.name}", "--timeout=120s")


class Unavailable(Exception):
    """Real nodes cannot run here; the message says why."""


@pytest.fixture(scope="session")
def real_nodes(cluster: Cluster) -> Iterator[list[RealNode]]:
    """The real nodes, for the session; or a skip that says why not (a failure in CI)."""
    built = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=True)
    try:
        with running_real_nodes(cluster, Path(built.stdout.strip())) as nodes:
            yield nodes
    except Unavailable as exc:
        skip_or_fail(f"no real nodes: {exc}")
