"""The e2e tier's views of pods and processes on the real nodes: a DDPJob's pod at an index, its rank's
process, that process's children, events, and the durable-checkpoint jobs the fault tests start."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ddp_trainer.launch import warm
from helpers.e2e import (
    children,
    container_pid,
    writable_folder,
)
from testcluster import processes
from testcluster.fixtures import Cluster
from testcluster.nodeconfig import RealNode


def durable_job(folder: Path, **spec: Any) -> dict[str, Any]:
    """A built-in trainer job whose checkpoints go to ``folder``, a hostPath mounted at the same path."""
    writable_folder(folder)
    return {"checkpoint": {"volume": {"hostPath": {"path": str(folder)}}, "mountPath": str(folder)}, **spec}


def pod_at(cluster: Cluster, namespace: str, job: str, index: int) -> dict[str, Any]:
    (pod,) = [
        p
        for p in children(cluster, namespace, "pods", job)
        if (p["metadata"].get("annotations") or {}).get("batch.kubernetes.io/job-completion-index")
        == str(index)
        and not p["metadata"].get("deletionTimestamp")
    ]
    return pod


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from the host's /proc, which sees every container's processes)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = parents.get(todo.pop(), [])
        found += below
        todo += below
    return found


def rank_process(nodes: list[RealNode], pod: dict[str, Any]) -> int:
    """The training process of a pod with one rank: the process below torchrun that the built-in trainer's
    launcher named after its rank (a fork of the launcher's fork server)."""
    main = container_pid(nodes, pod)
    tree = descendants(main)
    leaves = [pid for pid in tree if processes.name(pid).startswith(warm.WORKER_NAME_PREFIX)]
    assert len(leaves) == 1, (tree, leaves)
    return leaves[0]


CUT_TABLE = "ddpjob_test_cut"
"""The nftables table a network cut adds inside one pod's network namespace (and removes to restore)."""


@contextlib.contextmanager
def cut_network(nodes: list[RealNode], pod: dict[str, Any]) -> Iterator[None]:
    """Every packet into or out of ``pod`` (a real node's) dropped while the block runs: an nftables table
    of two drop chains inside the pod's own network namespace (the test's own; nothing outside it is
    touched), so its processes run on and its sockets stay open, its node stays Ready, and nobody hears
    from it: a node whose network is gone. Removed again at the end."""
    pid = container_pid(nodes, pod)
    rules = (
        f"table inet {CUT_TABLE} {{\n"
        "  chain in { type filter hook input priority -300; policy drop; }\n"
        "  chain out { type filter hook output priority -300; policy drop; }\n"
        "}\n"
    )
    enter = ["nsenter", "-t", str(pid), "-n", "nft"]
    subprocess.run([*enter, "-f", "-"], input=rules, text=True, check=True, capture_output=True)
    try:
        yield
    finally:
        subprocess.run([*enter, "delete", "table", "inet", CUT_TABLE], check=False, capture_output=True)


def apply_doc(cluster: Cluster, namespace: str, doc: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))


def pod_name_at(cluster: Cluster, namespace: str, job: str, index: int) -> str:
    """The name of the DDPJob's pod at completion ``index``."""
    return next(
        p["metadata"]["name"]
        for p in children(cluster, namespace, "pods", job)
        if (p["metadata"].get("annotations") or {}).get("batch.kubernetes.io/job-completion-index")
        == str(index)
    )


def events_text(cluster: Cluster, namespace: str, name: str) -> str:
    return cluster.kubectl(
        "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}"
    ).stdout


def checkpointing_trainer(**checkpoint: Any) -> dict[str, Any]:
    return {  # a pod goes at the first checkpoint; the steps after it prove the resume, no more
        "procsPerNode": 2,
        "trainer": {"steps": 160, "batchSize": 16, "checkpointEvery": 20},
        "syncCheck": {"everySteps": 20},
        "checkpoint": checkpoint,
    }
