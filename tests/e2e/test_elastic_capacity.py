"""Capacity that never comes does not hold an elastic DDPJob back (issue 54, item 4), on the real control
plane: a running job scaled up while no node can take a pod (every node cordoned) trains on at the size it
has, Succeeds verified once rank 0's report says its last step was reached, and no pod of it is left (the
operator shrinks the Job to index 0, which deletes the Pending pod and completes the Job). The pods run on
the node agents, as in test_scale.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from ddp_operator.local import elastic
from helpers.e2e import Operator, children, get, slow_elastic_job, stores, wait_phase
from helpers.local_jobs import signal_pod
from testcluster.fixtures import Cluster, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
NAME = "capacity"
INDEX = "batch.kubernetes.io/job-completion-index"


def _world_of(cluster: Cluster, namespace: str, tmp_path: Path, size: int, name: str = NAME) -> int:
    """Wait until rank 0 says a world of ``size`` was verified (its log line); its step."""

    def there() -> tuple[int, int] | None:
        for pod in children(cluster, namespace, "pods", name):
            log = cluster.kubectl("logs", "-n", namespace, pod["metadata"]["name"], check=False).stdout
            (tmp_path / f"{pod['metadata']['name']}.log").write_text(log)
        return next((w for w in elastic.worlds(sorted(tmp_path.glob("*.log"))) if w[0] == size), None)

    return wait_for(there, what=f"a world of {size} verified", timeout=240, every=1)[1]


def _pending_at(cluster: Cluster, namespace: str, index: str) -> dict[str, Any]:
    """Wait until the pod at ``index`` exists and the scheduler says it cannot place it."""

    def there() -> dict[str, Any] | None:
        for pod in children(cluster, namespace, "pods", NAME):
            said = {c["type"]: c for c in pod.get("status", {}).get("conditions", [])}
            scheduled = said.get("PodScheduled", {})
            if pod["metadata"]["labels"].get(INDEX) == index and scheduled.get("reason") == "Unschedulable":
                return pod
        return None

    return wait_for(there, what=f"pod {index} Pending, unschedulable", timeout=120, every=0.5)


def test_a_scale_up_that_never_gets_a_node_does_not_hold_back_a_finished_job(
    cluster: Cluster, operator: Operator, namespace: str, tmp_path: Path
) -> None:
    """2 nodes train; every node is cordoned and the job scaled to 3: the third pod stays Pending (no
    capacity). The two train to the last step; rank 0's report says so, verified: the DDPJob Succeeds in
    attempt 1 with no restart, the Job (the same one) is shrunk to index 0 and Complete, the Pending pod is
    gone and so is the rendezvous store, and the two pods that trained keep their logs. A slow model (30 ms
    a forward), so that it trains through the scale-up."""
    gate = tmp_path / "fast"  # opened once the scale-up pod is seen Pending: the rest at full speed
    doc = slow_elastic_job(NAME, fast_after=gate)
    started = time.monotonic()
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
    wait_phase(cluster, namespace, NAME, "Running", timeout=180)
    _world_of(cluster, namespace, tmp_path, 2)
    print(f"a world of 2 verified {time.monotonic() - started:.0f} s after the apply")
    nodes = cluster.kubectl_json("get", "nodes")["items"]
    cordoned = [n["metadata"]["name"] for n in nodes if not n.get("spec", {}).get("unschedulable")]
    try:
        for node in cordoned:  # no capacity anywhere: the scale-up pod never runs
            cluster.kubectl("cordon", node)
        cluster.kubectl("scale", "ddpjob", NAME, "-n", namespace, "--replicas=3")
        pending = _pending_at(cluster, namespace, index="2")
        running = get(cluster, namespace, NAME)["status"]
        assert running["phase"] == "Running", running  # BelowDesired: 2 of 3 train on
        gate.touch()
        print(f"the scale-up pod Pending {time.monotonic() - started:.0f} s after the apply")
        done = wait_phase(cluster, namespace, NAME, "Succeeded", "Failed", timeout=400)
        print(f"{done['status']['phase']} {time.monotonic() - started:.0f} s after the apply")
    finally:
        for node in cordoned:
            cluster.kubectl("uncordon", node, check=False)
    status = done["status"]
    assert status["phase"] == "Succeeded", status
    assert status["attempt"] == 1 and status["restarts"] == 0 and status["sync"]["verified"] is True, status
    assert status["progress"]["step"] == 800, status
    complete = {c["type"]: c for c in status["conditions"]}["Complete"]
    assert "1 pod(s) never started" in complete["message"], complete

    def nothing_left() -> dict[str, Any] | None:
        (job,) = children(cluster, namespace, "jobs", NAME)
        said = {c["type"] for c in job.get("status", {}).get("conditions", []) if c.get("status") == "True"}
        pods = children(cluster, namespace, "pods", NAME)
        alive = [p for p in pods if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]
        gone = all(p["metadata"]["uid"] != pending["metadata"]["uid"] for p in pods)
        ended = "Complete" in said and not alive and gone and not stores(cluster, namespace, "jobs", NAME)
        return job if ended else None

    job = wait_for(nothing_left, what="the Job complete, no pod of it left, no store", timeout=60, every=0.5)
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 1, job["spec"]
    ran = {p["metadata"]["labels"].get(INDEX) for p in children(cluster, namespace, "pods", NAME)}
    assert ran == {"0", "1"}, ran  # the two that trained stay, with their logs


def test_a_pod_that_left_the_world_does_not_hold_back_a_finished_job(
    cluster: Cluster, operator: Operator, namespace: str, tmp_path: Path
) -> None:
    """2 nodes train; every process of pod 0 (rank 0 of that world) is frozen (SIGSTOP: its sockets open,
    as a node whose power or network is gone) and left frozen. Pod 1 trains on alone, as rank 0 of a world
    of 1, to the last step; its report says so: the DDPJob Succeeds in attempt 1 with no restart, though
    pod 0 never ends, once it has run on ending.FINISH_WAIT_SECONDS past the finish, and the Complete
    message says why. The Job is shrunk to no index (completions 0): that ends pod 0 and completes the Job,
    pod 1 kept with its log. (Pod 0 finishing while another pod stays frozen takes the shrink to index 0
    that the scale-up test above proves; ``ddpjob local`` freezes pod 0 too, in test_elastic.py.)"""
    name = "leftworld"
    gate = tmp_path / "fast"  # opened once the world of 1 is verified: the rest at full speed
    doc = slow_elastic_job(name, fast_after=gate)
    started = time.monotonic()
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
    wait_phase(cluster, namespace, name, "Running", timeout=180)
    _world_of(cluster, namespace, tmp_path, 2, name)
    frozen = signal_pod(name, 0, signal.SIGSTOP)
    frozen_at = time.monotonic()
    try:
        _world_of(cluster, namespace, tmp_path, 1, name)
        print(f"pod 0 frozen → a world of 1 verified: {time.monotonic() - frozen_at:.1f} s")
        gate.touch()
        done = wait_phase(cluster, namespace, name, "Succeeded", "Failed", timeout=300)
        print(f"{done['status']['phase']} {time.monotonic() - started:.0f} s after the apply")
        assert any(Path(f"/proc/{pid}").exists() for pid in frozen), "pod 0 ended by itself"
    finally:
        for pid in frozen:  # the node reclaimed: its processes go
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    status = done["status"]
    assert status["phase"] == "Succeeded", status
    assert status["attempt"] == 1 and status["restarts"] == 0, status
    assert status["progress"]["step"] == 800, status
    complete = {c["type"]: c for c in status["conditions"]}["Complete"]
    assert "1 pod(s) still ran 10 s after rank 0 finished" in complete["message"], complete
    assert "shrinking the Job to no index (pod 0 was one of them)" in complete["message"], complete

    def nothing_left() -> dict[str, Any] | None:
        (job,) = children(cluster, namespace, "jobs", name)
        pods = children(cluster, namespace, "pods", name)
        alive = [p for p in pods if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]
        return job if not alive and not stores(cluster, namespace, "jobs", name) else None

    job = wait_for(nothing_left, what="no pod of the job left running, no store", timeout=90, every=0.5)
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 0, job["spec"]
    kept = {
        p["metadata"]["labels"].get(INDEX): p["status"].get("phase")
        for p in children(cluster, namespace, "pods", name)
    }
    assert kept.get("1") == "Succeeded", kept  # the pod that finished stays, with its log

    def complete() -> bool:
        (job,) = children(cluster, namespace, "jobs", name)
        return any(
            c["type"] == "Complete" and c["status"] == "True" for c in job["status"].get("conditions", [])
        )

    wait_for(complete, what="the Job Complete at completions 0", timeout=60, every=0.5)
