"""`ddpjob local` of an elastic DDPJob that heals (issue 57: the built-in trainer's default on gloo, nothing
asked in its env; a rigid job and a user's loop with ``DDPJOB_HEAL=1``): three one-process
pods; once the world of 3 trains, every process of pod 1 (in a second case pod 0, rank 0's) is SIGKILLed, as
a lost node. The other two heal in place, in the same processes: the healed world of 2 verified before its
first step, at most one step lost, nothing restored; the replacement pod grows the world back by a heal
too (its fresh worker takes its state from a survivor, not from storage), and the survivors' processes are
the same from before the loss to the world of 3 again; the job Succeeds in one attempt.

A heal that must fall back (``DDPJOB_CHAOS_HEAL_NUDGE``: rank 1 of the healed world nudges a parameter
during the heal): the healed world's replica check refuses it, the launchers say why and restart their
workers in place from the last checkpoint, the restart's cause names the refused heal, and the job
Succeeds in one attempt, verified. A worker crashed in one pod (the recovery drill): that pod starts its
workers afresh, and they join the others, which heal in place: state copied from a survivor.
A frozen pod (SIGSTOP): judged silent within the bound, its peers' workers shut their connections down
and heal in place; woken, it rejoins by a heal."""

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

from ddp_operator.decide import restarts
from ddp_operator.local import elastic
from ddp_trainer import contract
from ddp_trainer.launch.heal_round import FELL_BACK
from helpers import REPO
from helpers.local_jobs import RUN_SECONDS, job, pod_pids, pods_pythonpath, signal_pod, stop_job, unique_name

HELPERS = REPO / "tests" / "helpers"
HEALED = re.compile(
    r"elastic: world size (\d+) verified at step (\d+), before its first step \(healed in place: (\d+)"
)
RESTORED = re.compile(r".* restored step-\d+\..*")
JOINED = re.compile(r"state of step (\d+) from rank (\d+) over the process group \((\d+) bytes\)")
SAVED = re.compile(r"step (\d+): checkpoint saved to ")
REFUSED = "the healed world's replica check failed at step"


def builtin_job(
    name: str, checkpoint_every: int, env: dict[str, str] | None = None, elastic: bool = True
) -> dict[str, Any]:
    """The elastic job (a rigid one: ``elastic`` False, asked to heal with ``DDPJOB_HEAL=1``) of 3
    one-process pods of the built-in trainer, which heals by default: its ``checkpointEvery`` and more
    ``env``."""
    trainer = {
        "steps": 240,
        "batchSize": 16,
        "checkpointEvery": checkpoint_every,
        "model": "slow_factories:slow_until_full",
    }
    bounds = {"elastic": {"minNodes": 1, "maxNodes": 3}} if elastic else {}
    doc = job(name, nodes=3, procsPerNode=1, trainer=trainer, **bounds)
    doc["spec"]["syncCheck"] = {"everySteps": 20}
    doc["spec"]["env"] = [
        {"name": "PYTHONPATH", "value": pods_pythonpath(HELPERS)},
        *([] if elastic else [{"name": "DDPJOB_HEAL", "value": "1"}]),
        *({"name": key, "value": value} for key, value in (env or {}).items()),
    ]
    return doc


class HealRun:
    """One `ddpjob local` run of an elastic job of 3 one-process pods that heals, in ``tmp_path``: the
    built-in trainer's (:func:`builtin_job`) with its ``checkpointEvery`` and more ``env``, or ``doc``."""

    def __init__(
        self,
        tmp_path: Path,
        checkpoint_every: int = 10,
        env: dict[str, str] | None = None,
        doc: dict[str, Any] | None = None,
    ) -> None:
        self.name = name = unique_name()
        doc = builtin_job(name, checkpoint_every, env) if doc is None else doc
        doc["metadata"]["name"] = name
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
        """A world of 3 trains (under load the first world may be 2, grown to 3 when the late pod joins:
        by a heal, whose survivors' first step was in the world of 2)."""
        found = elastic.worlds(sorted(self.attempt.glob("*.log")))
        if not found or found[-1][0] != 3:
            return False
        healed = self.healed()
        if healed and healed[-1][1] == "3" and int(healed[-1][2]) == found[-1][1]:
            return True
        return "first optimizer step" in self.logs().split("world size 3")[-1]

    def healed(self) -> list[re.Match[str]]:
        """Rank 0's lines of the worlds healed in place, from every pod's log, in time order (rank 0 moves
        between pods: a joiner whose address sorts first is rank 0 of the grown world)."""
        lines = [
            line
            for log in self.attempt.glob("*.log")
            for line in log.read_text(errors="replace").splitlines()
            if HEALED.search(line)
        ]
        return [m for line in sorted(lines) if (m := HEALED.search(line)) is not None]  # stamped lines

    def restored(self) -> list[str]:
        return RESTORED.findall(self.logs())

    def saved(self) -> list[int]:
        """The steps of the checkpoints saved in the last world of 3 (only rank 0 saves)."""
        found = elastic.worlds(sorted(self.attempt.glob("*.log")))
        if not found or found[-1][0] != 3:
            return []
        return [int(step) for step in SAVED.findall(self.logs()) if int(step) > found[-1][1]]

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


def _last_worlds(summary: str) -> list[str]:
    """The last three worlds of ``ddpjob local``'s summary line, the first without its mark (a world of 3
    at the start may have been healed: a late pod's grow)."""
    worlds = summary.split("world sizes ", 1)[1].split(" (ranks)", 1)[0].split(" → ")[-3:]
    return [worlds[0].removesuffix(" (healed)"), *worlds[1:]]


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
    run.until("the healed world of 3", lambda: [m[1] for m in run.healed()][-2:] == ["2", "3"])
    healed = {node: sorted(pod_pids(run.name, node)) for node in survivors}
    said = run.logs()
    out = run.finish()
    assert before == healed and all(before.values()), (before, healed)  # across the shrink and the grow
    shrunk, grown = run.healed()[-2:]
    assert int(shrunk[3]) <= 1 and int(grown[3]) == 0, said[-5000:]  # the grow: none lost
    joined = [m for m in JOINED.finditer(said) if int(m[1]) == int(grown[2])]
    assert joined and int(joined[0][3]) > 0, said[-5000:]
    final = run.logs()
    assert set(run.restored()) == earlier, run.restored()  # nothing restored since the loss
    assert "healed in place into round" in final and "gang restart in place" not in final, final[-5000:]
    summary = next(line for line in out.splitlines() if "elastic: ran at world sizes" in line)
    assert _last_worlds(summary) == ["3", "2 (healed)", "3 (healed)"], summary
    assert re.search(r"healed in place: \d+ step\(s\) lost, [1-9]\d* bytes of state sent in all$", summary)
    print(shrunk[0], grown[0], joined[0][0], summary, sep="\n")


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
    assert refused is not None, final[-5000:]
    shrinks = [m[0] for m in HEALED.finditer(final) if m[1] != "3"]
    assert not shrinks, shrinks  # refused, never healed (the replacement's grow after may heal)
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
def test_a_crashed_worker_starts_afresh_and_joins_the_others_which_heal_in_place(tmp_path: Path) -> None:
    """The recovery drill SIGKILLs rank 1's worker after step 30: its own launcher starts its workers afresh
    (a heal covers a lost peer, not a crash of one's own), while the others' workers lost a peer and heal
    into the same round; the fresh worker meets them there and takes its state from a survivor, not from
    storage. Nothing restored since, no heal fell back, and the job Succeeds in one attempt, verified."""
    run = HealRun(tmp_path, checkpoint_every=10, env={"DDPJOB_CHAOS_CRASH": "rank=1,step=30"})
    run.finish()
    final = run.logs()
    joined = JOINED.search(final)
    assert joined is not None and int(joined[3]) > 0, final[-5000:]
    healed = [m for m in HEALED.finditer(final) if m[1] == "3" and m[2] == joined[1]]
    assert healed and int(healed[0][3]) <= 1, final[-5000:]
    assert not re.search(r"\[launcher\] the heal into round \d+ failed", final), final[-5000:]
    assert not run.restored(), run.restored()  # the crashed rank's state came from a survivor
    report = run.report(0)
    assert report["verified"] is True and report["step"] == 240, report
    print(joined[0], healed[0][0], sep="\n")


@pytest.mark.slow
def test_a_rigid_jobs_crashed_rank_starts_afresh_and_joins_the_others_which_heal_in_place(
    tmp_path: Path,
) -> None:
    """A rigid job (3 nodes, no ``elastic``) with ``DDPJOB_HEAL=1``: the recovery drill SIGKILLs rank 1's
    worker after step 30. Its launcher starts it afresh (counted: a restart in place of that node), the
    other two nodes' workers keep their processes and heal into the same world of 3, whose fresh rank takes
    its state from a survivor; nothing is restored from the checkpoint, and the job Succeeds verified."""
    doc = builtin_job("rigid", 10, {"DDPJOB_CHAOS_CRASH": "rank=1,step=30"}, elastic=False)
    run = HealRun(tmp_path, doc=doc)
    run.until("the world of 3 training", lambda: "first optimizer step of this run" in run.logs())
    before = {node: sorted(pod_pids(run.name, node)) for node in (0, 2)}
    run.until("the fresh rank joined", lambda: bool(JOINED.search(run.logs())) and bool(run.healed()))
    healed = {node: sorted(pod_pids(run.name, node)) for node in (0, 2)}
    out = run.finish()
    final = run.logs()
    assert before == healed and all(before.values()), (before, healed)
    joined = JOINED.search(final)
    assert joined is not None and int(joined[3]) > 0, final[-5000:]
    shown = [m for m in HEALED.finditer(final) if m[1] == "3" and m[2] == joined[1]]
    assert shown and int(shown[0][3]) <= 1, final[-5000:]
    assert "this pod's workers heal in place (another node restarts its failed rank" in final, final[-5000:]
    assert not re.search(r"\[launcher\] the heal into round \d+ failed", final), final[-5000:]
    assert not run.restored(), run.restored()  # the crashed rank's state came from a survivor
    report = run.report(0)
    assert report["verified"] is True and report["step"] == 240, report
    assert report["restartsInPlace"] == 1, report  # the crashed rank's node counted its own restart
    # and the report, the status and `ddpjob local` say where its workers' state came from
    assert report[contract.REPORT_LAST_RESTART_FROM] == contract.RESTART_FROM_OTHERS, report
    assert restarts.RESUMING_FROM[contract.RESTART_FROM_OTHERS] in out, out
    print(joined[0], shown[0][0], out.splitlines()[-3:], sep="\n")


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
    restored. Woken, it rejoins by a heal (its fresh workers take their state from a survivor), and the job
    Succeeds in one attempt."""
    survivors = (0, 2)
    run = HealRun(tmp_path, checkpoint_every=10)
    run.until("a world of 3 training, a checkpoint saved", lambda: run.at_three() and bool(run.saved()))
    before = {node: sorted(pod_pids(run.name, node)) for node in survivors}
    earlier = set(run.restored())
    frozen_at = time.monotonic()
    signal_pod(run.name, 1, signal.SIGSTOP)
    try:
        while (match := next((m for m in run.healed() if m[1] == "2"), None)) is None:
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
    assert set(run.restored()) == earlier, run.restored()  # nothing restored since the freeze
    summary = next(line for line in out.splitlines() if "elastic: ran at world sizes" in line)
    assert _last_worlds(summary) == ["3", "2 (healed)", "3 (healed)"], summary
    print(f"frozen → world of 2 healed and verified: {healed_in:.1f} s (bound {SILENT_BOUND_SECONDS:.0f} s)")
    print(match[0], summary, sep="\n")


@pytest.mark.slow
def test_a_users_loop_heals_in_place_through_its_one_call(tmp_path: Path) -> None:
    """examples/elastic-loop.yaml as shipped, with ``DDPJOB_HEAL=1``: a hand-written loop
    (examples/elastic_loop.py) whose steps run through ``HealingSyncHealth.train_step``. Pod 1 lost while the
    world of 3 trains: the other two heal in the same processes (at most one step lost), the replacement's
    fresh worker takes its state from a survivor when its object is built, and the script goes on to its
    last step: no restart, each world verified. The script runs under tests/helpers/slowed_until.py, slowed
    until the test saw the world of 3 healed back."""
    doc = yaml.safe_load((REPO / "examples" / "elastic-loop.yaml").read_text())
    example, *arguments = doc["spec"]["args"]
    assert example == "examples/elastic_loop.py", doc["spec"]["args"]
    doc["spec"]["args"] = [str(HELPERS / "slowed_until.py"), str(REPO / example), *arguments]
    flag = tmp_path / "regrown"
    env = {"STEPS": "1500", "DDPJOB_HEAL": "1", "SLOWED_UNTIL": str(flag)}
    doc["spec"]["env"] = [{"name": key, "value": value} for key, value in env.items()]
    run = HealRun(tmp_path, doc=doc)

    def three() -> bool:
        found = elastic.worlds(sorted(run.attempt.glob("*.log")))
        return bool(found) and found[-1][0] == 3

    run.until("a world of 3 training", three)
    time.sleep(2)
    before = {node: sorted(pod_pids(run.name, node)) for node in (0, 2)}
    signal_pod(run.name, 1, signal.SIGKILL)
    try:
        run.until("the healed world of 3", lambda: [m[1] for m in run.healed()][-2:] == ["2", "3"])
        healed = {node: sorted(pod_pids(run.name, node)) for node in (0, 2)}
    finally:
        flag.touch()
    said = run.logs()
    out = run.finish()
    assert before == healed and all(before.values()), (before, healed)  # across the shrink and the grow
    shrunk, grown = run.healed()[-2:]
    assert int(shrunk[3]) <= 1 and int(grown[3]) == 0, said[-5000:]
    joined = [m for m in JOINED.finditer(said) if int(m[1]) == int(grown[2])]
    assert joined and int(joined[0][3]) > 0, said[-5000:]
    final = run.logs()
    assert "healed in place into round" in final and "gang restart in place" not in final, final[-5000:]
    assert re.search(r"world size 2: healed in place, going on from step \d+", final), final[-5000:]
    assert "trained to step 1500 at world size 3" in final, final[-5000:]
    summary = next(line for line in out.splitlines() if "elastic: ran at world sizes" in line)
    assert _last_worlds(summary) == ["3", "2 (healed)", "3 (healed)"], summary
    assert "replicas verified bit-identical" in out, out
    print(shrunk[0], grown[0], joined[0][0], summary, sep="\n")
