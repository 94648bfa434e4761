"""A lost node, elastic against rigid, side by side in one run on the same job (``ddpjob local``).

    python bench/elastic_bench.py [--nodes 3] [--steps 400] [--kill-after-step 40]

The same DDPJob (``--nodes`` pods × 1 process on the CPU, the built-in trainer, a checkpoint every 5
steps) runs twice, elastic (``spec.elastic: {minNodes: 1, maxNodes: nodes}``) then rigid; in each, once rank
0 has passed ``--kill-after-step``, every process of pod 1 is SIGKILLed, as a lost node.

* elastic: the others re-rendezvous at the smaller world through the store no pod hosts; ten seconds later
  the replacement pod joins and the world grows back;
* rigid: the attempt fails and the gang restarts as attempt 2 (new pods), as today.

Measured from the trainer's own log timestamps (rank 0's "first optimizer step of this run" lines, which
each new world writes) and the kill's own clock:

* shrink (elastic) and recovery (rigid): seconds from the kill to the first step after it; steps lost: the
  step rank 0 had reached at the kill (its ``ddp_step`` metric) less the step it resumed from;
* grow (elastic): seconds of training lost to the replacement joining: from the running world's stop
  (its SIGTERM line) to the grown world's first step; steps lost the same way.

Goals on the 2-core machine (issue 42): shrink <= 0.5 of the rigid recovery; a grow loses <= 15 s. Prints
figures and ratios, never asserts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
FIRST_STEP = re.compile(
    r"^(\S+ \S+) \[rank 0\] INFO first optimizer step of this run: step (\d+)(?: \(resumed from (\d+)\))?"
)
SIGTERM = re.compile(r"^(\S+ \S+) \[rank 0\] WARNING received SIGTERM")
METRICS = re.compile(r"metrics (\S+) :(\d+)")


def _when(stamp: str) -> float:
    return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _doc(name: str, nodes: int, steps: int, elastic: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodes": nodes,
        "procsPerNode": 1,
        "device": "cpu",
        "trainer": {"steps": steps, "batchSize": 16, "checkpointEvery": 5},
        "syncCheck": {"everySteps": 20},
        "checkpoint": {"volumeClaimTemplate": {"size": "1Gi"}},
    }
    if elastic:
        spec["elastic"] = {"minNodes": 1, "maxNodes": nodes}
    return {"apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob", "metadata": {"name": name}, "spec": spec}


def _rank0_step(port: int) -> int:
    sys.path[:0] = [str(REPO / "operator"), str(REPO / "trainer_image")]
    from ddp_operator.observe import progress

    text = progress.scrape(port)
    return progress.parse([text]).step if text else -1


def _pod_pids(job: str, node_rank: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        env = dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
        if env.get("DDPJOB_NAME") == job and env.get("NODE_RANK") == str(node_rank):
            found.append(int(entry.name))
    return found


def run(folder: Path, name: str, nodes: int, steps: int, kill_after: int, elastic: bool) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.yaml").write_text(yaml.safe_dump(_doc(name, nodes, steps, elastic)))
    argv = [sys.executable, "-m", "ddp_operator", "local", "job.yaml", "--workdir", "runs"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO / "trainer_image")])}
    out_path = folder / "out.log"
    with open(out_path, "w") as out:
        process = subprocess.Popen(argv, cwd=folder, stdout=out, stderr=subprocess.STDOUT, env=env)
        port = None
        reached = -1
        while reached < kill_after:
            assert process.poll() is None, out_path.read_text()
            if port is None and (m := METRICS.search(out_path.read_text())):
                port = int(m.group(2))
            reached = _rank0_step(port) if port else -1
            time.sleep(0.2)
        killed_at = time.time()
        for pid in _pod_pids(name, 1):
            os.kill(pid, signal.SIGKILL)
        process.wait(timeout=900)
    lines = [
        line
        for log in sorted((folder / "runs" / name).glob("attempt-*/*.log"))
        for line in log.read_text(errors="replace").splitlines()
    ]
    firsts = sorted(
        (_when(m[1]), int(m[2]), int(m[3] or 0)) for line in lines if (m := FIRST_STEP.match(line))
    )
    terms = sorted(_when(m[1]) for line in lines if (m := SIGTERM.match(line)))
    after = [f for f in firsts if f[0] > killed_at]
    figures: dict[str, Any] = {"code": process.returncode, "reached": reached}
    if after:
        at, _, resumed = after[0]
        figures.update(recover_s=at - killed_at, recover_steps=reached - resumed)
    if elastic and len(after) > 1:
        at, _, resumed = after[1]
        stop = max((t for t in terms if after[0][0] < t < at), default=None)
        if stop is not None:
            figures.update(grow_s=at - stop, grow_steps=max(0, _step_before(lines, stop) - resumed))
    return figures


def _step_before(lines: list[str], when: float) -> int:
    """The last step rank 0 logged (a check or a checkpoint) before ``when``."""
    best = 0
    for line in lines:
        m = re.match(r"^(\S+ \S+) \[rank 0\] INFO step (\d+):", line)
        if m and _when(m[1]) <= when:
            best = max(best, int(m[2]))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--kill-after-step", type=int, default=40)
    parser.add_argument(
        "--keep", type=Path, help="run in this folder and keep its logs (default: a temp one)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="elastic-bench-") as tmp:
        where = args.keep or Path(tmp)
        elastic = run(where / "e", "bench-e", args.nodes, args.steps, args.kill_after_step, True)
        rigid = run(where / "r", "bench-r", args.nodes, args.steps, args.kill_after_step, False)
    print(f"{args.nodes} pods x 1 process (cpu/gloo), pod 1 SIGKILLed after step {args.kill_after_step}")
    print(f"  elastic: exit {elastic['code']}, {elastic}")
    print(f"  rigid:   exit {rigid['code']}, {rigid}")
    if "recover_s" in elastic and "recover_s" in rigid:
        ratio = elastic["recover_s"] / rigid["recover_s"]
        print(
            f"shrink {elastic['recover_s']:.1f} s ({elastic['recover_steps']} steps lost) vs rigid recovery "
            f"{rigid['recover_s']:.1f} s ({rigid['recover_steps']} steps lost): ratio {ratio:.2f} "
            "(goal <= 0.5)"
        )
    if "grow_s" in elastic:
        print(
            f"grow: {elastic['grow_s']:.1f} s of training lost, {elastic['grow_steps']} steps (goal <= 15 s)"
        )


if __name__ == "__main__":
    main()
