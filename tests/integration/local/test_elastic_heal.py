"""`ddpjob local` of an elastic DDPJob that heals (issue 57, stage 1; ``DDPJOB_HEAL=1`` in its env): three
one-process pods; once the world of 3 trains, every process of pod 1 (in a second case pod 0, rank 0's) is
SIGKILLed, as a lost node. The other two heal in place, in the same processes: their pods' processes
unchanged from before the loss to the healed world of 2, verified before its first step, at most one step
lost, nothing restored; the replacement pod grows the world back (a grow still restarts: the design's
stage 2), and the job Succeeds in one attempt."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ddp_operator.local import elastic
from helpers import REPO
from helpers.local_jobs import RUN_SECONDS, job, pod_pids, pods_pythonpath, signal_pod, stop_job, unique_name

HELPERS = REPO / "tests" / "helpers"
HEALED = re.compile(
    r"elastic: world size (\d+) verified at step (\d+), before its first step \(healed in place: (\d+)"
)


@pytest.mark.slow
@pytest.mark.parametrize("lost", [1, 0], ids=["pod1", "pod0"])
def test_a_lost_pod_is_healed_in_place_by_the_others_without_restarting_them(
    tmp_path: Path, lost: int
) -> None:
    survivors = [node for node in range(3) if node != lost]
    name = unique_name()
    trainer = {
        "steps": 240,
        "batchSize": 16,
        "checkpointEvery": 1000,
        "model": "slow_factories:slow_until_full",
    }
    doc = job(name, nodes=3, procsPerNode=1, elastic={"minNodes": 1, "maxNodes": 3}, trainer=trainer)
    doc["spec"]["syncCheck"] = {"everySteps": 20}
    doc["spec"]["env"] = [
        {"name": "PYTHONPATH", "value": pods_pythonpath(HELPERS)},
        {"name": "DDPJOB_HEAL", "value": "1"},
    ]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    attempt = tmp_path / "runs" / name / "attempt-1"
    argv = [sys.executable, "-m", "ddp_operator", "local", "job.yaml", "--workdir", "runs"]
    process = subprocess.Popen(
        argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    started = time.monotonic()

    def logs() -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(attempt.glob("*.log")))

    def until(what: str, ready: object) -> None:
        while not ready():  # type: ignore[operator]
            if process.poll() is not None or time.monotonic() - started > RUN_SECONDS:
                took = time.monotonic() - started
                raise AssertionError(f"{what}: not in {took:.0f} s; printed:\n{stop_job(process, name)}")
            time.sleep(0.1)

    def at_three() -> bool:  # under load the first world may be 2, grown to 3 when the late pod joins
        found = elastic.worlds(sorted(attempt.glob("*.log")))
        return (
            bool(found) and found[-1][0] == 3 and "first optimizer step" in logs().split("world size 3")[-1]
        )

    until("a world of 3 training", at_three)
    time.sleep(1)
    before = {node: sorted(pod_pids(name, node)) for node in survivors}
    earlier = set(re.findall(r".* restored step-\d+\..*", logs()))  # a grow at the start (a late pod's)
    signal_pod(name, lost, signal.SIGKILL)
    until("the healed world", lambda: HEALED.search(logs()) is not None)
    healed = {node: sorted(pod_pids(name, node)) for node in survivors}
    said = logs()
    try:
        out, _ = process.communicate(timeout=max(1.0, started + RUN_SECONDS - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the run did not end in time:\n{stop_job(process, name)}") from None
    assert (
        process.returncode == 0 and f"ddpjob local: {name}: Succeeded" in out and "after 1 attempt(s)" in out
    ), out
    assert before == healed and all(before.values()), (before, healed)
    match = HEALED.search(said)
    assert match is not None and match[1] == "2" and int(match[3]) <= 1, said[-5000:]
    step = int(match[2])
    final = logs()
    later = [line for line in re.findall(r".* restored step-\d+\..*", final) if line not in earlier]
    restored = [int(re.findall(r"restored step-(\d+)\.", line)[0]) for line in later]
    assert all(s > step for s in restored), (restored, step)  # only the grow's, after the heal
    assert "healed in place into round" in final and "gang restart in place" not in final, final[-5000:]
    summary = next(line for line in out.splitlines() if "elastic: ran at world sizes" in line)
    assert "3 → 2 (healed) → 3 (ranks)" in summary, summary  # the grow back restarts
    print(match[0], summary, sep="\n")
