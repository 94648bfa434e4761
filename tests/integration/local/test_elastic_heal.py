"""`ddpjob local` of an elastic DDPJob that heals (issue 57, stage 1; ``DDPJOB_HEAL=1`` in its env): three
one-process pods; once the world of 3 trains, every process of pod 1 (in a second case pod 0, rank 0's) is
SIGKILLed, as a lost node. The other two heal in place, in the same processes: their pods' processes
unchanged from before the loss to the healed world of 2, verified before its first step, at most one step
lost, nothing restored; the replacement pod grows the world back (a grow still restarts: the design's
stage 2), and the job Succeeds in one attempt.

A heal that must fall back (``DDPJOB_CHAOS_HEAL_NUDGE``: rank 1 of the healed world nudges a parameter
during the heal): the healed world's replica check refuses it, the launchers say why and restart their
workers in place from the last checkpoint, the restart's cause names the refused heal, and the job
Succeeds in one attempt, verified. A worker crashed in one pod (the recovery drill): that pod starts its
workers afresh, and the others, which lost a peer, fall back from their heal at once.
A frozen pod (SIGSTOP): judged silent within the bound, its peers' workers shut their connections down
and heal in place."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_operator.local import elastic
from ddp_trainer.launch.heal_round import FELL_BACK
from helpers import REPO
from helpers.local_jobs import RUN_SECONDS, job, pod_pids, pods_pythonpath, signal_pod, stop_job, unique_name

HELPERS = REPO / "tests" / "helpers"
HEALED = re.compile(
    r"elastic: world size (\d+) verified at step (\d+), before its first step \(healed in place: (\d+)"
)
RESTORED = re.compile(r".* restored step-\d+\..*")
SAVED = re.compile(r"step (\d+): checkpoint saved to ")
REFUSED = "the healed world's replica check failed at step"


class HealRun:
    """One `ddpjob local` run of the elastic job of 3 one-process pods that heals, in ``tmp_path``: its
    ``checkpointEvery`` and more ``env``."""

    def __init__(self, tmp_path: Path, checkpoint_every: int, env: dict[str, str] | None = None) -> None:
        self.name = name = unique_name()
        trainer = {
            "steps": 240,
            "batchSize": 16,
            "checkpointEvery": checkpoint_every,
            "model": "slow_factories:slow_until_full",
        }
        doc = job(name, nodes=3, procsPerNode=1, elastic={"minNodes": 1, "maxNodes": 3}, trainer=trainer)
        doc["spec"]["syncCheck"] = {"everySteps": 20}
        doc["spec"]["env"] = [
            {"name": "PYTHONPATH", "value": pods_pythonpath(HELPERS)},
            {"name": "DDPJOB_HEAL", "value": "1"},
            *({"name": key, "value": value} for key, value in (env or {}).items()),
        ]
        (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
        self.attempt = tmp_path / "runs" / name / "attempt-1"
        argv = [sys.executable, "-m", "ddp_operator", "local", "job.yaml", "--workdir", "runs"]
        self.process = subprocess.Popen(
            argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.started = time.monotonic()

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.attempt.glob("*.log")))

    def until(self, what: str, ready: Callable[[], bool]) -> None:
        while not ready():
            if self.process.poll() is not None or time.monotonic() - self.started > RUN_SECONDS:
                took = time.monotonic() - self.started
                raise AssertionError(
                    f"{what}: not in {took:.0f} s; printed:\n{stop_job(self.process, self.name)}"
                )
            time.sleep(0.1)

    def at_three(self) -> bool:
        """A world of 3 trains (under load the first world may be 2, grown to 3 when the late pod joins)."""
        found = elastic.worlds(sorted(self.attempt.glob("*.log")))
        return (
            bool(found)
            and found[-1][0] == 3
            and "first optimizer step" in self.logs().split("world size 3")[-1]
        )

    def restored(self) -> list[str]:
        return RESTORED.findall(self.logs())

    def saved(self) -> list[int]:
        """The steps of the checkpoints saved in a world of 3."""
        return [int(step) for step in SAVED.findall(self.logs().split("world size 3")[-1])]

    def finish(self) -> str:
        """What the run printed, once it ended, Succeeded in one attempt."""
        try:
            out, _ = self.process.communicate(timeout=max(1.0, self.started + RUN_SECONDS - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the run did not end in time:\n{stop_job(self.process, self.name)}"
            ) from None
        succeeded = f"ddpjob local: {self.name}: Succeeded" in out and "after 1 attempt(s)" in out
        assert self.process.returncode == 0 and succeeded, out
        return out

    def report(self, pod: int) -> dict[str, Any]:
        """Pod ``pod``'s final report."""
        text = (self.attempt / f"{self.name}-1-{pod}.termination-log").read_text()
        found: dict[str, Any] = yaml.safe_load(text)
        return found


def _steps(lines: list[str]) -> list[int]:
    return [int(re.findall(r"restored step-(\d+)\.", line)[0]) for line in lines]


@pytest.mark.slow
@pytest.mark.parametrize("lost", [1, 0], ids=["pod1", "pod0"])
def test_a_lost_pod_is_healed_in_place_by_the_others_without_restarting_them(
    tmp_path: Path, lost: int
) -> None:
    survivors = [node for node in range(3) if node != lost]
    run = HealRun(tmp_path, checkpoint_every=1000)
    run.until("a world of 3 training", run.at_three)
    time.sleep(1)
    before = {node: sorted(pod_pids(run.name, node)) for node in survivors}
    earlier = set(run.restored())  # a grow at the start (a late pod's)
    signal_pod(run.name, lost, signal.SIGKILL)
    run.until("the healed world", lambda: HEALED.search(run.logs()) is not None)
    healed = {node: sorted(pod_pids(run.name, node)) for node in survivors}
    said = run.logs()
    out = run.finish()
    assert before == healed and all(before.values()), (before, healed)
    match = HEALED.search(said)
    assert match is not None and match[1] == "2" and int(match[3]) <= 1, said[-5000:]
    step = int(match[2])
    final = run.logs()
    restored = _steps([line for line in run.restored() if line not in earlier])
    assert all(s > step for s in restored), (restored, step)  # only the grow's, after the heal
    assert "healed in place into round" in final and "gang restart in place" not in final, final[-5000:]
    summary = next(line for line in out.splitlines() if "elastic: ran at world sizes" in line)
    assert "3 → 2 (healed) → 3 (ranks)" in summary, summary  # the grow back restarts
    print(match[0], summary, sep="\n")


@pytest.mark.slow
def test_a_heal_the_replica_check_refuses_falls_back_to_a_restart_in_place_from_the_last_checkpoint(
    tmp_path: Path,
) -> None:
    run = HealRun(tmp_path, checkpoint_every=10, env={"DDPJOB_CHAOS_HEAL_NUDGE": "rank=1"})
    run.until("a world of 3 training, a checkpoint saved", lambda: run.at_three() and bool(run.saved()))
    time.sleep(1)
    earlier, saved = set(run.restored()), max(run.saved())
    signal_pod(run.name, 1, signal.SIGKILL)
    out = run.finish()
    final = run.logs()
    assert "fire drill: rank 1 nudges its parameters during the heal" in final, final[-5000:]
    refused = re.search(rf"\[launcher\] the heal into round \d+ failed \({REFUSED} (\d+)\)", final)
    assert refused is not None and HEALED.search(final) is None, final[-5000:]  # refused, never healed
    step = int(refused[1])
    cause = f"{FELL_BACK}: {REFUSED} {step}"
    assert f"[launcher] gang restart in place 1: {cause}; restarting" in final, final[-5000:]
    restored = _steps([line for line in run.restored() if line not in earlier])
    assert restored and saved <= restored[0] <= step, (restored, saved, step)  # the last before the loss
    assert f"restarted its gang in place 1 time(s) in the same pods (last: {cause}" in out, out
    report = run.report(0)
    assert report["verified"] is True and report["step"] == 240, report
    assert report["restartsInPlace"] == 1 and report["lastRestart"] == cause, report
    print(refused[0], cause, sep="\n")


@pytest.mark.slow
def test_a_crashed_worker_starts_afresh_and_the_others_fall_back_from_their_heal_at_once(
    tmp_path: Path,
) -> None:
    """The recovery drill SIGKILLs rank 1's worker after step 30: its own launcher starts its workers afresh
    (a heal covers a lost peer, not a crash of one's own, yet), while the others' workers lost a peer and
    heal into the same round. A round's members heal or start afresh together: the healers read in the
    store that a member started afresh and fall back at once (they waited a minute for ranks that never
    re-formed with them, then fell back on their own group's timeout), and the job Succeeds in one attempt,
    verified, from the last checkpoint."""
    run = HealRun(tmp_path, checkpoint_every=10, env={"DDPJOB_CHAOS_CRASH": "rank=1,step=30"})
    run.finish()
    final = run.logs()
    afresh = re.findall(
        r"\[launcher\] the heal into round (\d+) failed \((.+?) started its workers afresh in round (\d+)",
        final,
    )
    assert afresh and all(heal == fresh for heal, _, fresh in afresh), final[-5000:]
    assert HEALED.search(final) is None and "no healed mark within" not in final, final[-5000:]
    report = run.report(0)
    assert report["verified"] is True and report["step"] == 240, report
    print(*afresh, sep="\n")


SILENT_BOUND_SECONDS = 30.0
"""From the freeze to the smaller world verified: the keep-alive bound (5 s), the round, the heal."""


@pytest.mark.slow
def test_a_frozen_pod_is_judged_silent_and_the_others_heal_in_place_then_it_rejoins_when_it_wakes(
    tmp_path: Path,
) -> None:
    """Pod 1 frozen (SIGSTOP: its sockets stay open, so no collective fails by itself; gloo's abort does not
    end one blocked on it either). The launchers' keep-alive watch judges it silent within the bound and
    asks their workers to shut their connections down: the collective with it fails as after a peer's loss,
    and they heal in place, in the same processes: the world of 2 verified, at most one step lost, nothing
    restored. Woken, it rejoins (a grow: the world restarts), and the job Succeeds in one attempt."""
    survivors = (0, 2)
    run = HealRun(tmp_path, checkpoint_every=10)
    run.until("a world of 3 training, a checkpoint saved", lambda: run.at_three() and bool(run.saved()))
    before = {node: sorted(pod_pids(run.name, node)) for node in survivors}
    earlier = set(run.restored())
    frozen_at = time.monotonic()
    signal_pod(run.name, 1, signal.SIGSTOP)
    try:
        while (match := HEALED.search(run.logs())) is None:
            took = time.monotonic() - frozen_at
            assert took < SILENT_BOUND_SECONDS, f"no healed world {took:.0f} s after freezing:\n{run.logs()}"
            time.sleep(0.1)
        healed_in = time.monotonic() - frozen_at
        healed = {node: sorted(pod_pids(run.name, node)) for node in survivors}
    finally:
        signal_pod(run.name, 1, signal.SIGCONT)
    out = run.finish()
    final = run.logs()
    assert before == healed and all(before.values()), (before, healed)
    assert match[1] == "2" and int(match[3]) <= 1, match[0]
    assert "went silent: no keep-alive for" in final and "shut their connections down" in final, final[-5000:]
    assert "(why: NodeSilent)" in final, final[-5000:]
    restored = _steps([line for line in run.restored() if line not in earlier])
    assert all(s > int(match[2]) for s in restored), (restored, match[0])  # only the grow's, after the heal
    summary = next(line for line in out.splitlines() if "elastic: ran at world sizes" in line)
    assert "3 → 2 (healed) → 3 (ranks)" in summary, summary
    print(f"frozen → world of 2 healed and verified: {healed_in:.1f} s (bound {SILENT_BOUND_SECONDS:.0f} s)")
    print(match[0], summary, sep="\n")
