"""An elastic DDPJob resized by `kubectl scale` on the real control plane (the /scale subresource): the
same Indexed Job (same uid) grows and shrinks, no new attempt, and the job Succeeds, verified. The pods
run on the node agents (processes of this checkout's environment)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ddp_operator.local import elastic
from helpers.e2e import Operator, children, events, get, slow_elastic_job, stores, wait_phase
from testcluster.fixtures import Cluster, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _scaled_to(cluster: Cluster, namespace: str, name: str, nodes: int) -> dict[str, Any]:
    """Wait until the Job has ``nodes`` pods and the DDPJob says that many train."""

    def there() -> dict[str, Any] | None:
        (job,) = children(cluster, namespace, "jobs", name)
        status = get(cluster, namespace, name).get("status", {})
        sized = job["spec"]["parallelism"] == job["spec"]["completions"] == nodes
        elastic = status.get("elastic", {})
        # the world that trains, as the trainer says it (issue 54 item 6), not the pods that are Ready
        trains = elastic.get("nodes") == nodes and elastic.get("nodesFrom") == "Trainer"
        return job if sized and trains else None

    try:
        return wait_for(there, what=f"{name} at {nodes} node(s)", timeout=240, every=0.5)
    except AssertionError as exc:
        told = []
        for pod in children(cluster, namespace, "pods", name) + stores(cluster, namespace, "pods", name):
            log = cluster.kubectl("logs", "-n", namespace, pod["metadata"]["name"], check=False).stdout
            said = [line for line in log.splitlines() if "[launcher]" in line or "elastic:" in line]
            told.append(
                f"== {pod['metadata']['name']} ({pod['status'].get('phase')}):\n" + "\n".join(said[-12:])
            )
        raise AssertionError(f"{exc}\n" + "\n".join(told)) from None


def _pod_uids(cluster: Cluster, namespace: str, index: str) -> list[str]:
    """The uids of the elastic job's pods at completion ``index`` (a replaced pod adds one)."""
    pods = children(cluster, namespace, "pods", "elastic")
    key = "batch.kubernetes.io/job-completion-index"
    return sorted(p["metadata"]["uid"] for p in pods if p["metadata"]["labels"].get(key) == index)


def _worlds(cluster: Cluster, namespace: str, tmp_path: Path) -> list[tuple[int, int]]:
    """``(world size, step)`` of every world the trainer verified so far, from the pods' logs (rank 0 of
    each world says it), in time order: what `ddpjob local` lists."""
    for pod in children(cluster, namespace, "pods", "elastic"):
        log = cluster.kubectl("logs", "-n", namespace, pod["metadata"]["name"], check=False).stdout
        (tmp_path / f"{pod['metadata']['name']}.log").write_text(log)
    return elastic.worlds(sorted(tmp_path.glob("*.log")))


def _verified_at(cluster: Cluster, namespace: str, tmp_path: Path, size: int, after: int) -> int:
    """Wait for a world of ``size`` verified after the first ``after`` worlds; its step."""

    def there() -> tuple[int, int] | None:
        return next((w for w in _worlds(cluster, namespace, tmp_path)[after:] if w[0] == size), None)

    return wait_for(there, what=f"a world of {size} verified", timeout=240, every=1)[1]


def _launcher_lines(cluster: Cluster, namespace: str, said: str) -> dict[str, int]:
    """How many of each pod's ``[launcher]`` lines hold ``said``, by pod name."""
    counts: dict[str, int] = {}
    for pod in children(cluster, namespace, "pods", "elastic"):
        log = cluster.kubectl("logs", "-n", namespace, pod["metadata"]["name"], check=False).stdout
        counts[pod["metadata"]["name"]] = sum(1 for line in log.splitlines() if said in line)
    return counts


def test_kubectl_scale_resizes_the_same_job_and_the_trainer_follows_without_a_restart(
    cluster: Cluster, operator: Operator, namespace: str, tmp_path: Path
) -> None:
    """2 → 3 → 1 by `kubectl scale`: the same Job (uid), one attempt, no restart; the trainer verifies a
    world of each size in turn, and pod 0 is never replaced: the pods scaled away leave at a step
    boundary (their SIGTERM) and the survivor re-rendezvous alone in the same pod. A slow model (30 ms a
    forward), so that it trains through all of it. In the world of 3, the rendezvous store's pod is
    deleted (issue 54 item 5): its Job makes another, the DDPJob's ``RendezvousStoreReady`` says so (a
    Warning ``StoreLost``, then a Normal ``Serving``), every launcher reaches the new store, the world of 3
    trains on through it with no new world and no restart, and the scale to 1 then re-forms through the
    new store (before issue 54's store-outage fix, here, the world of 3 met again and the scale to 1 did not
    re-form)."""
    # the node agents mount no hostPath: each pod checkpoints to its own emptyDir (the local test of a pod
    # taken away, and the real-node test of a lost node, resume from a shared volume)
    gate = tmp_path / "fast"  # opened once the world of 1 is verified: the rest of the steps at full speed
    doc = slow_elastic_job("elastic", fast_after=gate)
    doc["spec"]["trainer"]["steps"] = 1200  # the store's outage in the world of 3 as well as both scales
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
    wait_phase(cluster, namespace, "elastic", "Running", timeout=180)
    (first,) = children(cluster, namespace, "jobs", "elastic")
    _verified_at(cluster, namespace, tmp_path, 2, after=0)
    seen = len(_worlds(cluster, namespace, tmp_path))
    # a rigid job refuses it; this one takes it: spec.nodes through the /scale subresource
    cluster.kubectl("scale", "ddpjob", "elastic", "-n", namespace, "--replicas=3")
    grown = _scaled_to(cluster, namespace, "elastic", 3)
    assert grown["metadata"]["uid"] == first["metadata"]["uid"]
    _verified_at(cluster, namespace, tmp_path, 3, after=seen)
    kept = _pod_uids(cluster, namespace, index="0")

    # then the rendezvous store's pod is deleted (issue 54): its Job makes another (the store exits 143, a
    # failed pod), the DDPJob says so, every launcher reaches the new store, and the world of 3 trains on
    def store_condition() -> dict[str, Any]:
        conditions = get(cluster, namespace, "elastic").get("status", {}).get("conditions", [])
        found: dict[str, Any] = {c["type"]: c for c in conditions}.get("RendezvousStoreReady", {})
        return found

    serving = wait_for(
        lambda: (found := store_condition()).get("status") == "True" and found,
        what="RendezvousStoreReady True (Serving) in the world of 3",
        timeout=60,
        every=0.5,
    )
    assert serving["reason"] == "Serving", serving
    before = len(_worlds(cluster, namespace, tmp_path))
    (store,) = stores(cluster, namespace, "pods", "elastic")
    cluster.kubectl("delete", "pod", "-n", namespace, store["metadata"]["name"], "--wait=false")

    history: list[dict[str, Any]] = []  # the condition as it changed, for a failure's message

    def serves_again() -> dict[str, Any] | None:
        said = store_condition()
        if not history or history[-1] != said:
            history.append(said)
        lost, back = (
            events(cluster, namespace, "elastic", "StoreLost"),
            events(cluster, namespace, "elastic", "Serving"),
        )
        return said if lost and back and said.get("status") == "True" else None

    try:
        said = wait_for(serves_again, what="StoreLost, then the store serving again", timeout=120, every=0.5)
    except AssertionError as exc:
        status = get(cluster, namespace, "elastic").get("status", {})
        seen_events = cluster.kubectl("get", "events", "-n", namespace, check=False).stdout
        pods = cluster.kubectl("get", "pods", "-n", namespace, "--show-labels", check=False).stdout
        told = operator.log.read_text()[-4000:]
        said = f"RendezvousStoreReady as it changed: {history}\n{seen_events}\n{pods}\n{told}"
        raise AssertionError(f"{exc}\n{said}") from None
    assert store["metadata"]["name"] not in said["message"], said  # the replacement serves
    # every launcher of the world of 3 reached the new store (one of them gave it the round back)
    reconnected = wait_for(
        lambda: (
            (found := _launcher_lines(cluster, namespace, "reconnected to the rendezvous store"))
            and len(found) == 3
            and all(found.values())
            and found
        ),
        what="every launcher's '[launcher] reconnected to the rendezvous store' line",
        timeout=90,
        every=1,
    )
    restored = _launcher_lines(cluster, namespace, "the rendezvous store came back empty: restored round")
    assert sum(restored.values()) >= 1, (reconnected, restored)
    # no node was lost with the store: the world of 3 trains on, no new world, nothing restarted
    after_loss = _worlds(cluster, namespace, tmp_path)
    assert after_loss[before - 1 :] == after_loss[-1:] and after_loss[-1][0] == 3, (before, after_loss)
    assert get(cluster, namespace, "elastic")["status"].get("restarts", 0) == 0

    # the scale to 1 re-forms the world through the new store
    seen = len(_worlds(cluster, namespace, tmp_path))
    cluster.kubectl("scale", "ddpjob", "elastic", "-n", namespace, "--replicas=1")
    shrunk = _scaled_to(cluster, namespace, "elastic", 1)
    assert shrunk["metadata"]["uid"] == first["metadata"]["uid"]
    left_at = _verified_at(cluster, namespace, tmp_path, 1, after=seen)
    worlds = _worlds(cluster, namespace, tmp_path)  # before the job ends (and its pods may go)
    print(f"worlds (size, step): {worlds}")
    gate.touch()
    done = wait_phase(cluster, namespace, "elastic", "Succeeded", "Failed", timeout=400)
    status = done["status"]
    assert status["phase"] == "Succeeded", status
    assert status["attempt"] == 1 and status["restarts"] == 0 and status["sync"]["verified"] is True, status
    # each scale counted once, though the world followed it in steps (issue 54 item 6): its reason, and the
    # seconds it cost once the world reached its size; the world counted is the trainer's own
    last = status["elastic"]["lastResize"]
    assert status["elastic"]["resizes"] == 2 and last["to"] == 1 and last["reason"] == "Scaled", status
    assert "secondsLost" in last, status
    assert [job["metadata"]["uid"] for job in children(cluster, namespace, "jobs", "elastic")] == [
        first["metadata"]["uid"]
    ]
    # the survivor was never replaced: it trained on rather than stopping with the pods scaled away
    assert _pod_uids(cluster, namespace, index="0") == kept, ("pod 0 was replaced", worlds)
    assert worlds[-1][0] == 1 and left_at > 0, worlds  # the survivor went on from a step, not from 0
    wide = cluster.kubectl("get", "ddpj", "elastic", "-n", namespace, "-o", "wide").stdout
    assert "ELASTIC" in wide.splitlines()[0]
