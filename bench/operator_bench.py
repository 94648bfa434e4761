"""The operator on the real control plane: how fast it answers, how much it writes, how much memory it holds.

    python bench/operator_bench.py [--sequential 50] [--burst 100] [--run 100] [--suspended 1000]
                                   [--tracemalloc]

Needs what the `cluster` tests need (root, the cached control-plane binaries of hack/cluster/build.sh);
reuses a cluster that `make cluster-up` started, else starts one and stops it at the end. The CRD and the
chart's RBAC are applied and `ddpjob operator` runs as a local process authenticating as the chart's
ServiceAccount, as in the e2e tests (tests/helpers/operator_process.py).
Three phases, each in a fresh namespace:

* sequential: ``--sequential`` suspended DDPJobs (nodes 2), created one after another through the API
  (a POST, what ``kubectl apply`` does after its own start-up): time from the POST to both the headless
  Service and the Job existing (seen by a watch), and to the status saying Suspended; p50, p99, max;
* burst: ``--burst`` suspended DDPJobs in one ``kubectl apply -f`` of a List: wall time until every one has
  its Service and Job, and until every status says Suspended;
* suspended (after the others; 0, the default, skips it): ``--suspended`` suspended DDPJobs in one
  ``kubectl apply -f``, as burst, at a scale (1000) that shows whether the operator holds a thousand;
* run: ``--run`` tiny DDPJobs (nodes 1, ``python -c pass``: one pod each, run by the node agent as a host
  process) in one ``kubectl apply``: wall time until every one is Succeeded (or Failed).

API writes are counted from the API server's audit log (testcluster/audit.py): every create, update,
patch and delete the operator's ServiceAccount made during a phase, until it has been quiet for 3 s; per
DDPJob, by resource; "besides status" leaves out ``patch ddpjobs/status``. Memory is the operator
process's VmRSS (now) and VmHWM (peak since start) from /proc/<pid>/status, and VmRSS again
(``rss_settled``) after the operator's timer has given freed heap back (ddp_operator.runtime.heap, 36 s
later).
In the phases applied at once, each DDPJob's create → children time runs from the first watch event of
the DDPJob to the later of its Service's and Job's (p50, p99, max), besides the wall time of the whole
apply; and again on the API server's clock (``create_to_children_by_server_s``: the audit log's completion
times of the DDPJob's create and of the operator's two creates), which no lag of this process's watches
can lengthen.

``--tracemalloc`` starts the operator with ``bench/memprobe`` on its PYTHONPATH, which traces its Python
allocations (slower, bigger: for where the memory goes, not for the figures) and after each phase prints
the live bytes by package (``tracemalloc`` on SIGUSR1). Prints figures, never asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # the test cluster (testcluster) and tests/helpers

from ddp_operator.runtime import heap  # noqa: E402
from ddp_operator.runtime.handlers import TIMER_INTERVAL_SECONDS  # noqa: E402
from helpers.operator_process import OPERATOR_USER, Operator, ddpjob, install  # noqa: E402
from testcluster.audit import AuditLog, writes_by_kind  # noqa: E402
from testcluster.fixtures import Cluster, running_cluster, unavailable_reason, wait_for  # noqa: E402
from testcluster.kubeapi import ApiError, Kube  # noqa: E402

DDPJOBS = "/apis/ddpjob.io/v1alpha1/namespaces/{ns}/ddpjobs"
FINAL = ("Succeeded", "Failed")


class FirstSeen:
    """Watches one namespaced collection in a thread; records, per object name, the first moment
    (``time.monotonic()``) its watch event satisfied ``when``."""

    def __init__(self, kubeconfig: Path, path: str, when: Callable[[dict[str, Any]], bool]) -> None:
        self.kube, self.path, self.when = Kube(str(kubeconfig)), path, when
        self.times: dict[str, float] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        version: str | None = None
        while not self.stopping.is_set():
            params = {"resourceVersion": version} if version else {}
            try:
                for event in self.kube.watch(self.path, timeout_seconds=5, **params):
                    now, obj = time.monotonic(), event["object"]
                    if event["type"] == "ERROR":  # 410 Gone: start again from now
                        version = None
                        break
                    version = obj["metadata"]["resourceVersion"]
                    name = obj["metadata"].get("name")
                    if event["type"] in ("ADDED", "MODIFIED") and name not in self.times and self.when(obj):
                        self.times[name] = now
                    if self.stopping.is_set():
                        break
            except (ApiError, OSError):
                time.sleep(0.5)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=20)


def phase_is(*phases: str) -> Callable[[dict[str, Any]], bool]:
    return lambda obj: (obj.get("status") or {}).get("phase") in phases


def watchers(cluster: Cluster, namespace: str, final: Iterable[str]) -> dict[str, FirstSeen]:
    kubeconfig = cluster.kubeconfig
    return {
        "service": FirstSeen(kubeconfig, f"/api/v1/namespaces/{namespace}/services", lambda _: True),
        "job": FirstSeen(kubeconfig, f"/apis/batch/v1/namespaces/{namespace}/jobs", lambda _: True),
        "status": FirstSeen(kubeconfig, DDPJOBS.format(ns=namespace), phase_is(*final)),
        "created": FirstSeen(kubeconfig, DDPJOBS.format(ns=namespace), lambda _: True),
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def quiet_writes(audit: AuditLog, since: int, *, quiet: float = 3.0, timeout: float = 60) -> list[Any]:
    """The operator's requests since ``since``, once it has made no new one for ``quiet`` seconds."""
    deadline = time.monotonic() + timeout
    count, still_since = -1, time.monotonic()
    while True:
        requests = audit.requests(since=since, user=OPERATOR_USER)
        if len(requests) != count:
            count, still_since = len(requests), time.monotonic()
        elif time.monotonic() - still_since >= quiet or time.monotonic() > deadline:
            return requests
        time.sleep(0.5)


def describe_writes(requests: list[Any], jobs: int) -> dict[str, Any]:
    counts = writes_by_kind(requests)
    total = sum(counts.values())
    status = counts.get("patch ddpjobs/status", 0)
    events = sum(n for kind, n in counts.items() if kind.endswith(" events"))
    return {
        "by_kind_per_job": {kind: round(n / jobs, 2) for kind, n in sorted(counts.items())},
        "per_job": round(total / jobs, 2),
        "per_job_besides_status": round((total - status) / jobs, 2),
        "per_job_besides_status_and_events": round((total - status - events) / jobs, 2),
        "refused": sum(1 for r in requests if r.mutating and r.code >= 400),
    }


def children_after_creation(audit: AuditLog, since: int, namespace: str, names: list[str]) -> list[float]:
    """Per DDPJob, on the API server's own clock (its audit log, so no watcher of this process lags behind):
    its creation's completion → the later completion of the operator's creates of its Service and Job."""
    done: dict[str, dict[str, float]] = {"ddpjobs": {}, "services": {}, "jobs": {}}
    for r in audit.requests(since=since):
        if r.namespace == namespace and r.verb == "create" and not r.dry_run and r.code < 300:
            done.get(r.resource, {})[r.name] = r.at
    created, services, jobs = done["ddpjobs"], done["services"], done["jobs"]
    return [
        max(services[n], jobs[f"{n}-1"]) - created[n]
        for n in names
        if n in created and n in services and f"{n}-1" in jobs
    ]


def new_namespace(cluster: Cluster, prefix: str) -> str:
    return cluster.create_namespace(prefix)


def sequential(cluster: Cluster, operator: Operator, count: int) -> dict[str, Any]:
    namespace = new_namespace(cluster, "bench-seq")
    seen = watchers(cluster, namespace, ["Suspended"])
    mark = cluster.audit.mark()
    children, reconciled = [], []
    for i in range(count):
        name = f"seq-{i:03d}"
        started = time.monotonic()
        cluster.kube.create(DDPJOBS.format(ns=namespace), ddpjob(name, suspend=True))
        job = f"{name}-1"

        def there(name: str = name, job: str = job) -> bool:
            return name in seen["service"].times and job in seen["job"].times and name in seen["status"].times

        wait_for(
            there,
            what=f"the Service, Job and Suspended status of {name}",
            timeout=60,
            every=0.002,
        )
        children.append(max(seen["service"].times[name], seen["job"].times[job]) - started)
        reconciled.append(seen["status"].times[name] - started)
    writes = describe_writes(quiet_writes(cluster.audit, mark), count)
    for watcher in seen.values():
        watcher.stop()
    return {
        "namespace": namespace,
        "jobs": count,
        "children_s": summary(children),
        "status_s": summary(reconciled),
        "writes": writes,
        "memory_mib": settled_memory(operator),
    }


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(statistics.median(values), 3),
        "p99": round(percentile(values, 0.99), 3),
        "max": round(max(values), 3),
        "min": round(min(values), 3),
    }


def apply_at_once(
    cluster: Cluster, operator: Operator, prefix: str, count: int, final: tuple[str, ...], **spec: Any
) -> dict[str, Any]:
    namespace = new_namespace(cluster, f"bench-{prefix}")
    seen = watchers(cluster, namespace, final)
    names = [f"{prefix}-{i:04d}" for i in range(count)]
    documents = {"apiVersion": "v1", "kind": "List", "items": [ddpjob(n, **spec) for n in names]}
    mark = cluster.audit.mark()
    started = time.monotonic()
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(documents))
    applied = time.monotonic() - started
    every_child = wait_for(
        lambda: (
            all(n in seen["service"].times and f"{n}-1" in seen["job"].times for n in names)
            and max(max(seen["service"].times.values()), max(seen["job"].times.values())) - started
        ),
        what=f"a Service and a Job for each of {count} DDPJobs",
        timeout=600,
        every=0.05,
    )
    every_status = wait_for(
        lambda: (
            all(n in seen["status"].times for n in names) and max(seen["status"].times.values()) - started
        ),
        what=f"{count} DDPJobs to be {' or '.join(final)}",
        timeout=900,
        every=0.05,
    )
    writes = describe_writes(quiet_writes(cluster.audit, mark), count)
    for watcher in seen.values():
        watcher.stop()
    each = [
        max(seen["service"].times[n], seen["job"].times[f"{n}-1"]) - seen["created"].times.get(n, started)
        for n in names
    ]
    by_server = children_after_creation(cluster.audit, mark, namespace, names)
    phases = [
        j.get("status", {}).get("phase") for j in cluster.kube.get(DDPJOBS.format(ns=namespace))["items"]
    ]
    return {
        "namespace": namespace,
        "jobs": count,
        "kubectl_apply_s": round(applied, 2),
        "all_children_s": round(every_child, 2),
        "create_to_children_s": summary(each),
        "create_to_children_by_server_s": {**summary(by_server), "jobs": len(by_server)} if by_server else {},
        "all_final_s": round(every_status, 2),
        "phases": {p: phases.count(p) for p in set(phases)},
        "writes": writes,
        "memory_mib": settled_memory(operator),
    }


def delete_all(cluster: Cluster, operator: Operator, namespaces: list[str]) -> dict[str, Any]:
    """Deletes every DDPJob (then the namespaces); the operator's writes for the deletions."""
    mark = cluster.audit.mark()
    started = time.monotonic()
    count = 0
    for namespace in namespaces:
        count += len(cluster.kube.get(DDPJOBS.format(ns=namespace))["items"])
        cluster.kubectl("delete", "ddpjobs", "--all", "-n", namespace, "--wait=true", "--timeout=300s")
    took = time.monotonic() - started
    writes = describe_writes(quiet_writes(cluster.audit, mark), max(count, 1))
    for namespace in namespaces:
        cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=300s")
    memory = settled_memory(operator)
    return {"jobs": count, "delete_s": round(took, 2), "writes": writes, "memory_mib": memory}


def settled_memory(operator: Operator) -> dict[str, float]:
    """The operator's memory now (``rss``, ``peak``), and its RSS again once its timer has given the heap
    freed after the phase back to the system (``rss_settled``: :mod:`ddp_operator.runtime.heap`)."""
    now = operator.memory_mib()
    time.sleep(heap.TRIM_EVERY_SECONDS + TIMER_INTERVAL_SECONDS + 1)
    return {**now, "rss_settled": operator.memory_mib()["rss"]}


def python_memory(pid: int, traced: Path) -> str:
    """The operator's traced Python memory now (bench/memprobe writes a line on SIGUSR1)."""
    before = len(traced.read_text().splitlines()) if traced.exists() else 0
    os.kill(pid, signal.SIGUSR1)
    wait_for(
        lambda: traced.exists() and len(traced.read_text().splitlines()) > before,
        what="the operator's tracemalloc snapshot",
        timeout=120,
    )
    return traced.read_text().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequential", type=int, default=50, help="suspended DDPJobs, one after another")
    parser.add_argument("--burst", type=int, default=100, help="suspended DDPJobs in one kubectl apply")
    parser.add_argument("--run", type=int, default=100, help="tiny DDPJobs that run, in one kubectl apply")
    parser.add_argument(
        "--suspended", type=int, default=0, help="suspended DDPJobs in one kubectl apply, last (e.g. 1000)"
    )
    parser.add_argument(
        "--no-delete", action="store_true", help="skip the deletion phase (the cluster goes anyway)"
    )
    parser.add_argument(
        "--tracemalloc", action="store_true", help="print the operator's Python memory by package per phase"
    )
    args = parser.parse_args(argv)
    if reason := unavailable_reason():
        print(f"operator_bench: {reason}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {}
    with running_cluster() as cluster, tempfile.TemporaryDirectory(prefix="operator-bench-") as tmp:
        operator = Operator(install(cluster), Path(tmp) / "operator.log")
        traced = Path(tmp) / "tracemalloc.jsonl"
        if args.tracemalloc:
            os.environ["PYTHONPATH"] = os.pathsep.join(
                [str(REPO / "bench" / "memprobe"), os.environ.get("PYTHONPATH", "")]
            )
            os.environ["DDPJOB_TRACEMALLOC_OUT"] = str(traced)
        operator.start()
        namespaces: list[str] = []
        try:
            results["idle"] = {"memory_mib": settled_memory(operator)}

            def say(key: str) -> None:
                print(f"{key}: {json.dumps(results[key])}", flush=True)
                if args.tracemalloc and operator.process is not None:
                    print(f"{key} tracemalloc: {python_memory(operator.process.pid, traced)}", flush=True)

            say("idle")
            if args.sequential:
                results["sequential"] = sequential(cluster, operator, args.sequential)
                namespaces.append(results["sequential"]["namespace"])
                say("sequential")
            if args.burst:
                results["burst"] = apply_at_once(
                    cluster, operator, "burst", args.burst, ("Suspended",), suspend=True
                )
                namespaces.append(results["burst"]["namespace"])
                say("burst")
            if args.run:
                tiny = {"nodes": 1, "command": ["python", "-c", "pass"], "maxRestarts": 0}
                results["run"] = apply_at_once(cluster, operator, "run", args.run, FINAL, **tiny)
                namespaces.append(results["run"]["namespace"])
                say("run")
            if args.suspended:
                results["suspended"] = apply_at_once(
                    cluster, operator, "susp", args.suspended, ("Suspended",), suspend=True
                )
                namespaces.append(results["suspended"]["namespace"])
                say("suspended")
            if not args.no_delete:
                results["deleted"] = delete_all(cluster, operator, namespaces)
                say("deleted")
        finally:
            operator.stop()
            for namespace in namespaces:
                cluster.kubectl(
                    "delete", "namespace", namespace, "--ignore-not-found", "--wait=false", check=False
                )
    version = subprocess.run(["uname", "-srm"], capture_output=True, text=True).stdout.strip()
    print(f"machine: {version}; operator user: {OPERATOR_USER}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
