"""Load on the real control plane: a hundred DDPJobs at once, and a soak of short jobs under random pod kills.

Pods are host processes of the node agent on a 2-core machine, so the jobs are tiny (``python -c``). What
the operator created is read from the API server's audit log (testcluster/audit.py), which records every
request of the operator's ServiceAccount: exactly one Service and one Job per attempt means exactly one
successful create of each, whatever happened in between, not only what is left at the end.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import time
from typing import Any

import pytest

from helpers.e2e import Operator, ddpjob
from helpers.operator_process import OPERATOR_USER
from testcluster import processes
from testcluster.audit import Request
from testcluster.fixtures import Cluster, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

FINAL = ("Succeeded", "Failed")
MEMORY_BOUND_MIB = 400  # generous: measured figures are in bench/RESULTS.md


def _ddpjobs(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kube.get(
        f"/apis/ddpjob.io/v1alpha1/namespaces/{namespace}/ddpjobs"
    )["items"]
    return items


def _all_final(cluster: Cluster, namespace: str, count: int, timeout: float) -> list[dict[str, Any]]:
    def final() -> list[dict[str, Any]] | None:
        jobs = _ddpjobs(cluster, namespace)
        done = [j for j in jobs if (j.get("status") or {}).get("phase") in FINAL]
        return jobs if len(jobs) == count and len(done) == count else None

    try:
        return wait_for(final, what=f"all {count} DDPJobs to reach a final phase", timeout=timeout, every=2)
    except AssertionError as exc:
        stuck = {
            j["metadata"]["name"]: (j.get("status") or {}).get("phase")
            for j in _ddpjobs(cluster, namespace)
            if (j.get("status") or {}).get("phase") not in FINAL
        }
        raise AssertionError(f"{exc}; not final: {stuck}") from None


def _apply_all(cluster: Cluster, namespace: str, documents: list[dict[str, Any]]) -> None:
    """One `kubectl apply` of every document at once (a List), as a user applies a folder of jobs."""
    cluster.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}),
    )


def _creates(requests: list[Request], namespace: str, resource: str) -> collections.Counter[str]:
    return collections.Counter(
        r.name
        for r in requests
        if r.verb == "create"
        and r.resource == resource
        and r.namespace == namespace
        and r.code == 201
        and not r.dry_run  # the dry run before an attempt that creates a checkpoint claim stores nothing
    )


def _assert_one_service_and_one_job_per_attempt(
    requests: list[Request], namespace: str, jobs: list[dict[str, Any]]
) -> None:
    services, created_jobs = _creates(requests, namespace, "services"), _creates(requests, namespace, "jobs")
    for job in jobs:
        name, attempt = job["metadata"]["name"], int(job["status"]["attempt"])
        assert services[name] == 1, f"{name}: {services[name]} Services created"
        expected = {f"{name}-{a}": 1 for a in range(1, attempt + 1)}
        mine = {n: c for n, c in created_jobs.items() if n.rsplit("-", 1)[0] == name}
        assert mine == expected, f"{name} (attempt {attempt}): Jobs created {mine}"


def _delete_all_and_see_nothing_left(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("delete", "ddpjobs", "--all", "-n", namespace, "--wait=true", "--timeout=180s")

    def left() -> dict[str, list[str]]:
        out = {}
        for kind, path in (
            ("jobs", f"/apis/batch/v1/namespaces/{namespace}/jobs"),
            ("pods", f"/api/v1/namespaces/{namespace}/pods"),
            ("services", f"/api/v1/namespaces/{namespace}/services"),
        ):
            out[kind] = [o["metadata"]["name"] for o in cluster.kube.get(path)["items"]]
        return out

    wait_for(lambda: not any(left().values()), what="no Job, Pod or Service left", timeout=180, every=1)
    running = [p for p in cluster.layout.pods.glob(f"{namespace}_*/*.pid") if processes.read_pid(p)]
    assert not running, f"pod processes still running: {running}"


def test_a_hundred_jobs_at_once_all_finish_with_one_service_and_job_each(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    count = 100
    names = [f"load-{i:03d}" for i in range(count)]
    documents = [ddpjob(n, nodes=1, command=["python", "-c", "pass"]) for n in names]
    mark = cluster.audit.mark()
    started = time.monotonic()
    _apply_all(cluster, namespace, documents)
    jobs = _all_final(cluster, namespace, count, timeout=420)
    took = time.monotonic() - started
    phases = collections.Counter(j["status"]["phase"] for j in jobs)
    assert phases == {"Succeeded": count}, {
        j["metadata"]["name"]: j["status"] for j in jobs if j["status"]["phase"] != "Succeeded"
    }
    requests = cluster.audit.requests(since=mark, user=OPERATOR_USER)
    _assert_one_service_and_one_job_per_attempt(requests, namespace, jobs)
    memory = operator.memory_mib()
    writes = sum(1 for r in requests if r.mutating)
    print(
        f"{count} DDPJobs applied at once: all Succeeded in {took:.1f} s; "
        f"operator memory {memory['rss']:.0f} MiB (peak {memory['peak']:.0f} MiB); "
        f"{writes / count:.1f} operator writes per DDPJob"
    )
    assert memory["peak"] < MEMORY_BOUND_MIB, memory
    _delete_all_and_see_nothing_left(cluster, namespace)


def _kill_a_pod(cluster: Cluster, namespace: str, rng: random.Random) -> str | None:
    """Kills one running pod of ``namespace`` the way ``rng`` picks: an API delete (what a chaos tool or a
    node drain does) or SIGKILL of its container's process (an OOM kill, a crash). Says what it did."""
    pods = [
        p
        for p in cluster.kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]
    if not pods:
        return None
    pod = rng.choice(sorted(pods, key=lambda p: p["metadata"]["name"]))
    meta = pod["metadata"]
    if rng.random() < 0.5:
        cluster.kube.delete(f"/api/v1/namespaces/{namespace}/pods/{meta['name']}")
        return f"deleted {meta['name']}"
    folder = cluster.layout.pods / f"{namespace}_{meta['name']}_{meta['uid'][:8]}"
    for pid_file in folder.glob("*.pid"):
        if (pid := processes.read_pid(pid_file)) is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # it ended between the read and the kill
                return None
            return f"SIGKILL {meta['name']} (pid {pid})"
    return None


def test_a_soak_of_short_jobs_under_random_pod_kills_ends_with_every_job_final_and_nothing_left(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    seed = int(os.environ.get("DDPJOB_SOAK_SEED") or random.SystemRandom().randrange(2**32))
    print(f"soak seed: {seed} (DDPJOB_SOAK_SEED={seed} repeats the choices)")
    rng = random.Random(seed)
    count, kills_wanted = 20, 12
    sleep = "import time; time.sleep(4)"
    documents = [
        ddpjob(f"soak-{i:02d}", maxRestarts=2, command=["python", "-c", sleep]) for i in range(count)
    ]
    mark = cluster.audit.mark()
    started = time.monotonic()
    _apply_all(cluster, namespace, documents)
    kills: list[str] = []
    deadline = time.monotonic() + 180
    while len(kills) < kills_wanted and time.monotonic() < deadline:
        time.sleep(rng.uniform(0.3, 1.5))  # the kills' pace, drawn from the seed: no wait for anything
        if all((j.get("status") or {}).get("phase") in FINAL for j in _ddpjobs(cluster, namespace)):
            break
        if done := _kill_a_pod(cluster, namespace, rng):
            kills.append(done)
    print(f"seed {seed}: {len(kills)} kills: {kills}")
    jobs = _all_final(cluster, namespace, count, timeout=300)
    took = time.monotonic() - started
    for job in jobs:
        status, name = job["status"], job["metadata"]["name"]
        conditions = {c["type"]: c for c in status.get("conditions", [])}
        if status["phase"] == "Failed":
            failed = conditions.get("Failed", {})
            assert failed.get("status") == "True" and failed.get("reason") and failed.get("message"), (
                seed,
                name,
            )
        else:
            assert conditions.get("Complete", {}).get("status") == "True", (seed, name, status)
    requests = cluster.audit.requests(since=mark, user=OPERATOR_USER)
    _assert_one_service_and_one_job_per_attempt(requests, namespace, jobs)
    phases = collections.Counter(j["status"]["phase"] for j in jobs)
    restarts = sum(int(j["status"]["restarts"]) for j in jobs)
    print(f"seed {seed}: {dict(phases)}, {restarts} gang restarts, all final in {took:.1f} s")
    _delete_all_and_see_nothing_left(cluster, namespace)
