"""Recovery time on the real control plane: a rank dies, how long until the gang steps again?

    python bench/recovery_bench.py [--repeat 1] [--crash-step 300]

Needs what the `cluster` tests need (root, the cached control-plane binaries of hack/cluster/build.sh; run
it under the cluster lock: ``flock /tmp/ddpjob-cluster.lock python bench/recovery_bench.py``); reuses a
cluster that `make cluster-up` started, else starts one and stops it at the end. The operator runs as in
the e2e tests (tests/helpers/operator_process.py). Both paths, one after the other, in one run, the same job
(2 nodes × 1 process, the built-in trainer, checkpoints every 50 steps on a hostPath volume):

* in place: the recovery fire drill ``DDPJOB_CHAOS_CRASH=rank=1,step=S`` makes rank 1 SIGKILL itself after
  step S; torchrun's agents restart both pods' workers in the same pods;
* Job recreation: the same drill with ``PET_MAX_RESTARTS=0`` in the job's env (no restart in place): the pod
  fails, the Job fails, the operator deletes it and creates attempt 2, whose new pods resume.

Measured from the trainer's own log timestamps, never from a scrape: the death is rank 1's drill line
("fire drill: rank 1 kills itself", written just before the SIGKILL); the recovery is rank 0's next
"first optimizer step of this run" line (a resumed one). Prints figures, never asserts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # the test cluster (testcluster) and tests/helpers

from helpers.operator_process import Operator, ddpjob, install  # noqa: E402
from testcluster.fixtures import Cluster, running_cluster, unavailable_reason  # noqa: E402

STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
DRILL = "fire drill: rank 1 kills itself"
FIRST_STEP = "first optimizer step of this run"


def stamp_of(line: str) -> float:
    match = STAMP.match(line)
    assert match, line
    return dt.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def pods_of(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = cluster.kubectl_json(
        "get", "pods", "-n", namespace, "-l", f"ddpjob.io/job-name={name}"
    )["items"]
    return found


def pod_at(cluster: Cluster, namespace: str, name: str, attempt: int, index: int) -> str | None:
    for pod in pods_of(cluster, namespace, name):
        meta = pod["metadata"]
        if (
            meta["labels"].get("ddpjob.io/attempt") == str(attempt)
            and meta["annotations"].get("batch.kubernetes.io/job-completion-index") == str(index)
            and pod["status"].get("phase") in ("Running", "Succeeded", "Failed")
        ):
            return str(meta["name"])
    return None


def log_line(cluster: Cluster, namespace: str, pod: str, words: str, after: float = 0.0) -> str | None:
    for line in cluster.logs(namespace, pod).splitlines():
        if words in line and STAMP.match(line) and stamp_of(line) >= after:
            return line
    return None


def poll(check: Any, what: str, timeout: float, every: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = check()
        except subprocess.CalledProcessError:
            found = None
        if found:
            return found
        time.sleep(every)
    raise TimeoutError(f"recovery_bench: no {what} after {timeout:.0f}s")


def one(cluster: Cluster, namespace: str, path: str, crash_step: int, folder: Path) -> dict[str, Any]:
    """Run the job until the drill fires and the gang steps again; the figures of one recovery."""
    name = f"rec-{path}-{int(time.time()) % 100000}"
    env = [{"name": "DDPJOB_CHAOS_CRASH", "value": f"rank=1,step={crash_step}"}]
    if path == "recreate":
        env.append({"name": "PET_MAX_RESTARTS", "value": "0"})  # the user's env wins: no restart in place
    ckpt = folder / name
    doc = ddpjob(
        name,
        trainer={"steps": 1000000, "checkpointEvery": 50},
        syncCheck={"everySteps": 50},
        checkpoint={"volume": {"hostPath": {"path": str(ckpt)}}, "mountPath": str(ckpt)},
        env=env,
        maxRestarts=3,
    )
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
    try:
        victim = poll(lambda: pod_at(cluster, namespace, name, 1, 1), "pod 1 of attempt 1", 180)
        drill = poll(lambda: log_line(cluster, namespace, victim, DRILL), "drill line", 240, every=0.2)
        died = stamp_of(drill)
        attempt = 1 if path == "inplace" else 2
        rank0 = poll(lambda: pod_at(cluster, namespace, name, attempt, 0), f"pod 0 of attempt {attempt}", 300)
        first = poll(
            lambda: log_line(cluster, namespace, rank0, FIRST_STEP, after=died),
            "first step after the restore",
            300,
        )
        restored = log_line(cluster, namespace, rank0, "restored ", after=died) or ""
        status = cluster.kubectl_json("get", "ddpjob", name, "-n", namespace).get("status", {})
        return {
            "path": path,
            "seconds": round(stamp_of(first) - died, 2),
            "death": drill.split(" [")[0],
            "first_step": first.split("INFO ")[-1],
            "restored": restored.split("INFO ")[-1],
            "attempt": status.get("attempt"),
            "restarts": status.get("restarts"),
            "restartsInPlace": status.get("restartsInPlace", 0),
        }
    finally:
        cluster.kubectl(
            "delete", "ddpjob", name, "-n", namespace, "--wait=true", "--timeout=180s", check=False
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="recoveries per path")
    parser.add_argument("--crash-step", type=int, default=300, help="rank 1 dies after this step")
    args = parser.parse_args(argv)
    if reason := unavailable_reason():
        print(f"recovery_bench: {reason}", file=sys.stderr)
        return 2
    results: dict[str, list[dict[str, Any]]] = {"inplace": [], "recreate": []}
    with running_cluster() as cluster, tempfile.TemporaryDirectory(prefix="recovery-bench-") as tmp:
        operator = Operator(install(cluster), Path(tmp) / "operator.log")
        operator.start()
        namespace = cluster.create_namespace("bench-recovery")
        try:
            for _ in range(args.repeat):
                for path in ("inplace", "recreate"):
                    result = one(cluster, namespace, path, args.crash_step, Path(tmp))
                    results[path].append(result)
                    print(json.dumps(result), flush=True)
        finally:
            operator.stop()
            cluster.kubectl(
                "delete", "namespace", namespace, "--ignore-not-found", "--wait=false", check=False
            )
    medians = {}
    for path, runs in results.items():
        seconds = sorted(r["seconds"] for r in runs)
        medians[path] = seconds[len(seconds) // 2]
        print(f"{path}: death → first step after the restore: {seconds} s (median {medians[path]})")
    print(f"ratio in place / recreation (medians): {medians['inplace'] / medians['recreate']:.2f}")
    version = subprocess.run(["uname", "-srm"], capture_output=True, text=True).stdout.strip()
    print(f"machine: {version}, {len(os.sched_getaffinity(0))} cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
