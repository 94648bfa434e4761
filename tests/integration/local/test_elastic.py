"""`ddpjob local` of an elastic DDPJob: the rendezvous store outside every pod, a lost pod (node 0, the
one a worker-hosted store would have taken with it) replaced while the others go on, every world
verified; and the pure parts of local/elastic.py."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from ddp_operator.api.spec import Spec, parse
from ddp_operator.decide import ending
from ddp_operator.local import elastic
from ddp_trainer import contract
from ddp_trainer.launch import warm
from helpers import REPO
from helpers.local_jobs import (
    RUN_SECONDS,
    job,
    pod_pids,
    pods_pythonpath,
    run_local,
    signal_pod,
    stop_job,
    unique_name,
)
from testcluster import processes

ELASTIC = {"minNodes": 1, "maxNodes": 3}
EXAMPLES = REPO / "examples"
HELPERS = REPO / "tests" / "helpers"


def _spec(**overrides: object) -> Spec:
    return parse(job("e", **{"nodes": 3, "procsPerNode": 1, "elastic": ELASTIC, **overrides}))


def test_a_failed_pod_is_replaced_while_enough_others_run() -> None:
    spec = _spec()
    assert elastic.replaceable(spec, [-9, None, None], 0, 0)
    assert elastic.replaceable(spec, [None, 1, None], 1, 0)
    assert not elastic.replaceable(spec, [None, None, None], 0, 0)  # running
    assert not elastic.replaceable(spec, [0, None, None], 0, 0)  # done
    assert not elastic.replaceable(spec, [2, None, None], 0, 0)  # usage error
    assert not elastic.replaceable(spec, [86, None, None], 0, 0)  # divergence
    assert not elastic.replaceable(spec, [-9, None, None], 0, 3)  # fails each time
    strict = _spec(elastic={"minNodes": 3, "maxNodes": 3})
    assert not elastic.replaceable(strict, [-9, None, None], 0, 0)  # below min
    rigid = parse(job("r", nodes=3, procsPerNode=1))
    assert not elastic.replaceable(rigid, [-9, None, None], 0, 0)


def test_the_worlds_come_from_rank_0s_lines_in_time_order(tmp_path: Path) -> None:
    line = "{} [rank 0] INFO elastic: world size {} verified at step {}, before its first step; x"
    (tmp_path / "a.log").write_text(
        line.format("2026-11-27 10:00:00,000", 3, 0) + "\n" + line.format("2026-11-27 10:00:30,500", 3, 40)
    )
    healed_line = line.format("2026-11-27 10:00:10,000", 2, 20).replace(
        "; x", " (healed in place: 1 step(s) lost"
    )
    (tmp_path / "b.log").write_text("noise\n" + healed_line + "\n")
    healed: elastic.Healed = {}
    found = elastic.worlds(sorted(tmp_path.glob("*.log")), healed)
    assert found == [(3, 0), (2, 20), (3, 40)] and healed == {(2, 20): (1, 0)}
    assert elastic.summary(found) == (
        "elastic: ran at world sizes 3 → 2 → 3 (ranks), each verified before its first step (steps 0, 20, 40)"
    )
    assert elastic.summary(found, healed) == (
        "elastic: ran at world sizes 3 → 2 (healed) → 3 (ranks), each verified before its first step "
        "(steps 0, 20, 40); 1 healed in place: 1 step(s) lost, 0 bytes of state sent in all"
    )
    assert "no world reported its size" in elastic.summary([])


def _run_and(tmp_path: Path, name: str, file: str, ready: Callable[[], bool], act: Callable[[], None]) -> str:
    """`ddpjob local FILE` (DDPJob ``name``) in ``tmp_path``; once ``ready()``, ``act()``; everything it
    printed, after it ended with exit 0. Both within :data:`helpers.local_jobs.RUN_SECONDS` of the start;
    a run that misses it is stopped and fails saying what it printed."""
    argv = [sys.executable, "-m", "ddp_operator", "local", file, "--workdir", "runs"]
    process = subprocess.Popen(
        argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    started = time.monotonic()

    def fail(said: str) -> AssertionError:
        took = time.monotonic() - started
        return AssertionError(f"{said} ({took:.0f} s); `ddpjob local` printed:\n{stop_job(process, name)}")

    while not ready():
        if process.poll() is not None or time.monotonic() - started > RUN_SECONDS:
            raise fail("never ready to act: the run ended or ran out of time")
        time.sleep(0.1)
    act()
    try:
        out, _ = process.communicate(timeout=max(1.0, started + RUN_SECONDS - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise fail("the run did not end in time") from None
    assert process.returncode == 0, out
    return out


def _lose_pod(tmp_path: Path, name: str, file: str, node: int, saved: str) -> str:
    """:func:`_run_and`: once a checkpoint matching ``saved`` exists, every process of pod ``node`` is
    SIGKILLed, as a lost node."""
    checkpoints = tmp_path / "runs" / name / "volumes" / "checkpoint"

    def kill() -> None:
        signal_pod(name, node, signal.SIGKILL)

    return _run_and(tmp_path, name, file, lambda: bool(list(checkpoints.glob(saved))), kill)


def _three_pods(tmp_path: Path, steps: int, checkpoint_every: int, heal: bool = True, **trainer: str) -> str:
    """An elastic job (1-3 nodes) of three one-process pods in ``tmp_path``/job.yaml; its name. ``trainer``:
    more of spec.trainer (a ``model`` of tests/helpers, on the pods' PYTHONPATH). ``heal`` False: the
    path before heals, asked for (``DDPJOB_HEAL=0``: every world's workers start anew)."""
    name = unique_name()
    trainer = {"steps": steps, "batchSize": 16, "checkpointEvery": checkpoint_every, **trainer}
    doc = job(name, nodes=3, procsPerNode=1, elastic=ELASTIC, trainer=trainer, syncCheck={"everySteps": 20})
    env = [{"name": "PYTHONPATH", "value": pods_pythonpath(HELPERS)}] if "model" in trainer else []
    doc["spec"]["env"] = env + ([] if heal else [{"name": "DDPJOB_HEAL", "value": "0"}])
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    return name


@pytest.mark.slow
def test_a_users_elastic_script_resumes_in_each_world_and_each_world_is_verified(tmp_path: Path) -> None:
    """examples/elastic-loop.yaml as shipped but for its name and its end: a script of the user's
    (examples/elastic_loop.py: SyncHealth, its own checkpoint, its share of a fixed global batch). Pod 1
    is lost after the first save; the others resume at world size 2 from it, the replacement grows the
    world back, and each world is verified before its first step (SyncHealth says so for ddpjob local).
    The script runs under tests/helpers/elastic_loop_until_regrown.py, which ends it only in the world of
    3 that the replacement grew (100 steps after it resumed): the test waits for that event (within
    local_jobs.RUN_SECONDS) instead of racing the replacement, 10 s behind (the Job controller's
    back-off) plus its start, against a fixed length of training."""
    doc = yaml.safe_load((EXAMPLES / "elastic-loop.yaml").read_text())
    name = doc["metadata"]["name"] = unique_name()
    example, *arguments = doc["spec"]["args"]
    assert example == "examples/elastic_loop.py", doc["spec"]["args"]
    doc["spec"]["args"] = [str(HELPERS / "elastic_loop_until_regrown.py"), str(REPO / example), *arguments]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    out = _lose_pod(tmp_path, name, "job.yaml", 1, "elastic-loop.pt")
    assert f"ddpjob local: {name}: Succeeded" in out and "after 1 attempt(s)" in out, out
    summary = next(line for line in out.splitlines() if "elastic: ran at world sizes" in line)
    sizes = summary.split("world sizes ", 1)[1].split(" (ranks)")[0].split(" → ")
    assert sizes[0] == "3" and len(sizes) >= 2 and sizes[-1] == "3", (summary, out)
    resumed = [int(found) for found in re.findall(r"world size 3: resumed from step (\d+)", out)]
    assert resumed and f"trained to step {resumed[-1] + 100} at world size 3" in out, out
    # the sync line counts the checks of the attempt's worlds (issue 58 item 3), not the last alone: each
    # world's SyncHealth report carries the earlier worlds' tally (worlds.carry_worlds); a world whose
    # workers were stopped before they wrote a report (the first, cut short by the loss) adds none
    counted = re.search(r"replicas verified bit-identical (\d+) times across 3 ranks in (\d+) worlds", out)
    assert counted and 2 <= int(counted[2]) <= len(sizes), (sizes, out)
    last_world = re.findall(r'"checks":(\d+),[^\n]*"resumedFromStep":' + str(resumed[-1]), out)
    assert last_world and int(counted[1]) > int(last_world[-1]), (last_world, out)


@pytest.mark.slow
def test_losing_node_0_shrinks_the_world_and_its_replacement_grows_it_back(tmp_path: Path) -> None:
    """Three pods of one process; once the first checkpoint is written, every process of pod 0 (node 0,
    rank 0 of the first world) is SIGKILLed, as a lost node. The other two re-rendezvous at once through
    the store no pod hosts and train on at world size 2; the replacement pod joins ten seconds later at a
    step boundary and the world is 3 again; every world is verified before its first step; one attempt,
    the job Succeeds. The model (slow_factories.slow_until_full) is slow in a world smaller than 3 (0.5 s
    a step): the replacement has 100 s or more to grow the world back, where it needs ~10 s plus its
    start, instead of racing the end of a fast world of 2."""
    name = _three_pods(tmp_path, steps=240, checkpoint_every=5, model="slow_factories:slow_until_full")
    out = _lose_pod(tmp_path, name, "job.yaml", 0, "step-*.pt")
    assert f"ddpjob local: {name}: Succeeded" in out and "after 1 attempt(s)" in out, out
    assert (
        f"{name}-1-0 was killed by SIGKILL (exit -9): the other 2 pod(s) go on at a smaller world (elastic)"
        in out
    ), out
    summary = next(line for line in out.splitlines() if "elastic: ran at world sizes" in line)
    worlds = summary.split("world sizes ", 1)[1].split(" (ranks)")[0]
    sizes = [size.split()[0] for size in worlds.split(" → ")]
    # under load the first world may be 2 (a pod past the rendezvous' last call, which grows it to 3); each
    # change healed in place (the default) or, where the loss came as a world's workers started, restarted
    assert "2" in sizes and sizes[-1] == "3", summary
    assert "replicas verified bit-identical" in out
    assert not pod_pids(name, 0) and not pod_pids(name, 1)


def _launcher_of(job: str, node_rank: int) -> int:
    """The PID of pod ``node_rank``'s launcher (the container's PID 1 in a cluster: what the kubelet
    signals when the pod is deleted, evicted, preempted or scaled away)."""
    (pid,) = [
        pid
        for pid in pod_pids(job, node_rank)
        if b"ddp_trainer.launch" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    return pid


@pytest.mark.slow
def test_a_pod_taken_away_leaves_at_a_step_boundary_and_the_others_train_on_without_losing_a_step(
    tmp_path: Path,
) -> None:
    """Three pods; once a world of 3 is verified, pod 1's launcher gets SIGTERM alone, as the kubelet sends
    a pod that is deleted, evicted, preempted or scaled away. Its rank asks the others to stop at the next
    step boundary, rank 0 saves there, pod 1 exits 143 and the other two, not signalled, re-rendezvous at
    world size 2 and resume from that very step: one attempt, no restart spent, no step lost (the only
    checkpoint is the one the leave wrote: checkpointEvery is past the end)."""
    name = _three_pods(tmp_path, steps=200, checkpoint_every=1000)
    attempt = tmp_path / "runs" / name / "attempt-1"
    seen: list[tuple[int, int]] = []

    def worlds() -> list[tuple[int, int]]:
        return elastic.worlds(sorted(attempt.glob("*.log")))

    def at_three() -> bool:  # under load the first world may be 2, grown to 3 when the late pod joins
        return bool(now := worlds()) and now[-1][0] == 3

    def take_pod_1_away() -> None:
        seen.extend(worlds())
        os.kill(_launcher_of(name, 1), signal.SIGTERM)

    out = _run_and(tmp_path, name, "job.yaml", at_three, take_pod_1_away)
    assert f"ddpjob local: {name}: Succeeded" in out and "after 1 attempt(s)" in out, out
    assert (
        f"{name}-1-1 was stopped by SIGTERM (exit 143): the other 2 pod(s) go on at a smaller world (elastic)"
        in out
    ), out
    after = worlds()
    assert after[: len(seen)] == seen and after[len(seen)][0] == 2, (seen, after, out)
    left_at = after[len(seen)][1]
    # resumed from the leave's own save, not from before the world of 3 began
    assert left_at >= seen[-1][1], (seen, after)
    logs = {path.name: path.read_text() for path in attempt.glob("*.log")}
    said = "\n".join(logs.values())
    # the file's name carries the world's fence number after the first world (.w2: a late pod's grow)
    restored = rf"restored step-{left_at:08d}\.{name}(\.w\d+)?\.pt \(step {left_at};"
    assert re.search(restored, said), said
    assert "the world changed from 3 to 2 node(s) (elastic): no restart spent" in said, said
    assert "[launcher] stopped by SIGTERM" in logs[f"{name}-1-1.log"], said


@pytest.mark.slow
def test_an_elastic_job_whose_command_runs_torchrun_itself_keeps_its_store_on_node_0_and_trains(
    tmp_path: Path,
) -> None:
    """`command: [torchrun]` with a plain DDP script as published (examples/plain_ddp.py): torchrun's own
    rendezvous, hosted by node 0 as in a cluster (render.external_store), so `ddpjob local` starts no store
    of its own on that port (it did, and node 0 failed every attempt with EADDRINUSE)."""
    name = unique_name()
    doc = job(
        name,
        procsPerNode=1,
        elastic={"minNodes": 1, "maxNodes": 2},
        command=["torchrun"],
        args=[str(EXAMPLES / "plain_ddp.py")],
        env=[{"name": "STEPS", "value": "30"}],
        syncCheck={"everySteps": 10},
    )
    doc["spec"].pop("trainer")
    code, out = run_local(tmp_path, [doc])
    assert code == 0 and f"ddpjob local: {name}: Succeeded" in out and "after 1 attempt(s)" in out, out
    assert "in a process of its own" not in out and "EADDRINUSE" not in out, out


SLOW_RANK_SECONDS = 12.0
"""How long a rank is stopped while its agent renews: twice the 6 s after which a member that stopped renewing
is judged silent (``silence.MARGIN_SECONDS`` past the 5 s keep-alive bound)."""
SILENT_BOUND_SECONDS = 30.0
"""Issue 54's bound: from the freeze to the first step of the smaller world."""


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


@pytest.mark.slow
def test_a_frozen_node_0_is_dropped_within_the_bound_and_rejoins_when_it_wakes(tmp_path: Path) -> None:
    """Three pods of one process; once a world of 3 trains, pod 2's worker alone is stopped for 12 s while
    its agent renews as usual: a slow rank, never dropped. Then every process of pod 0 (rank 0, the round's
    host of the workers' store) is frozen with SIGSTOP: its sockets stay open, as with a node whose power or
    network is gone, so no collective of the others fails. Their agents see its keep-alive stop, stop their
    own workers and train on at world size 2 within the bound, with spec.nccl.timeoutSeconds at its default
    (30 min). Then pod 0 wakes (SIGCONT): its agent finds itself dropped, stops its stale workers before they
    train beside the new world (or heal into it, as their severed connections ask), and joins at a step
    boundary like any new node. One attempt, no restart counted. Last, the rendezvous store's process is
    killed: the world of 3 trains on without it and the job Succeeds, every world verified, in one attempt."""
    name = _three_pods(tmp_path, steps=500, checkpoint_every=10)
    attempt = tmp_path / "runs" / name / "attempt-1"
    argv = [sys.executable, "-m", "ddp_operator", "local", "job.yaml", "--workdir", "runs"]
    process = subprocess.Popen(
        argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )

    def worlds() -> list[tuple[int, int]]:
        return elastic.worlds(sorted(attempt.glob("*.log")))

    started = time.monotonic()

    def wait_for(what: Callable[[], bool], seconds: float, said: str) -> float:
        """When ``what()`` held, within ``seconds`` (and the run's :data:`RUN_SECONDS`); else the run is
        stopped and the test fails saying what it saw."""
        deadline = min(time.monotonic() + seconds, started + RUN_SECONDS)
        while not what():
            if process.poll() is not None or time.monotonic() > deadline:
                found, took = worlds(), time.monotonic() - started
                out = stop_job(process, name)
                raise AssertionError(
                    f"{said} within {seconds:.0f} s ({took:.0f} s in); worlds {found}\n{out}"
                )
            time.sleep(0.1)
        return time.monotonic()

    try:
        wait_for(lambda: bool(now := worlds()) and now[-1][0] == 3, RUN_SECONDS, "no world of 3")
        seen = worlds()
        # A slow rank is not a silent one: pod 2's worker alone is stopped (a rank far behind the others, or
        # rank 0 writing a long checkpoint) while its agent renews as usual. The others wait for it in their
        # collective; nobody is dropped. The sleep shows that nothing happens: twice the time after which a
        # member whose agent stopped renewing is judged silent (bound + margin, 6 s).
        slow = [pid for pid in pod_pids(name, 2) if processes.name(pid).startswith(warm.WORKER_NAME_PREFIX)]
        assert slow, f"no worker of pod 2 among {pod_pids(name, 2)}"
        for pid in slow:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(SLOW_RANK_SECONDS)
        for pid in slow:
            os.kill(pid, signal.SIGCONT)
        assert worlds() == seen, (seen, worlds())  # no smaller world for a slow rank
        frozen_at = time.monotonic()
        signal_pod(name, 0, signal.SIGSTOP)
        shrunk_at = wait_for(lambda: len(worlds()) > len(seen), SILENT_BOUND_SECONDS, "no smaller world")
        signal_pod(name, 0, signal.SIGCONT)
        wait_for(
            lambda: len(now := worlds()) > len(seen) + 1 and now[-1][0] == 3,
            RUN_SECONDS,
            "no world of 3 again",
        )
        # then the rendezvous store's process is lost: the world of 3 trains on to the end without it
        (store,) = [
            int(entry.name)
            for entry in Path("/proc").iterdir()
            if entry.name.isdigit()
            and b"ddp_trainer.launch.store" in _read(entry / "cmdline")
            and _read(entry / "stat").rsplit(b")", 1)[-1].split()[1:2] == [str(process.pid).encode()]
        ]
        os.kill(store, signal.SIGKILL)
        worlds_at_kill = worlds()
        out, _ = process.communicate(timeout=max(1.0, started + RUN_SECONDS - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the run did not end in time; it printed:\n{stop_job(process, name)}") from None
    finally:
        if process.poll() is None:
            with contextlib.suppress(AssertionError):
                signal_pod(name, 0, signal.SIGCONT)
            stop_job(process, name)
    after = worlds()
    assert after[len(seen)][0] == 2, (seen, after, out)
    print(f"frozen → world of 2 verified: {shrunk_at - frozen_at:.1f} s (bound {SILENT_BOUND_SECONDS:.0f} s)")
    assert process.returncode == 0, out
    assert f"ddpjob local: {name}: Succeeded" in out and "after 1 attempt(s)" in out, out
    assert after[-1][0] == 3, (after, out)  # the woken node joined again
    logs = {path.name: path.read_text() for path in attempt.glob("*.log")}
    said = "\n".join(logs.values())
    assert "went silent: no keep-alive for" in said, said
    assert "this node was dropped from its round as silent" in logs[f"{name}-1-0.log"], said
    # its stale worker, woken, found its connections severed and asked for a heal: the world went on
    # without it, so the launcher stops it instead (a heal would meet the others steps behind them)
    assert "healing this pod's workers in place" not in logs[f"{name}-1-0.log"], logs[f"{name}-1-0.log"]
    assert "gang restart in place" not in said, said  # a silent peer is a resize, never a restart
    # the store lost, said (by the launcher's watch or by torch's agent, whichever reads it first), a new one
    # reached, and the world of 3 trained on to the end through it: no new world, no exit-barrier error
    assert "the rendezvous store does not answer" in said, said
    assert "reconnected to the rendezvous store" in said, said
    assert after == worlds_at_kill, (worlds_at_kill, after, out)
    assert "Error waiting on exit barrier" not in said, said
    assert "replicas verified bit-identical" in out, out


@pytest.mark.slow
def test_a_pod_that_stays_frozen_does_not_hold_back_the_job_that_finished_without_it(tmp_path: Path) -> None:
    """Three pods of one process; once a world of 3 trains and wrote a checkpoint, every process of pod 0
    (rank 0 of that world) is frozen with SIGSTOP and left frozen, as a node that never comes back. The two
    others train on at world size 2, to the last step, verified, and their reports say so: the job Succeeds
    in one attempt without waiting for the frozen pod (stopped by `ddpjob local` ending.FINISH_WAIT_SECONDS
    later, as the operator shrinks the Job to index 0), and its end is not counted a failure (it was: a gang
    restart, attempt 2, after the training had finished)."""
    name = _three_pods(tmp_path, steps=300, checkpoint_every=10)
    attempt = tmp_path / "runs" / name / "attempt-1"
    checkpoints = tmp_path / "runs" / name / "volumes" / "checkpoint"

    def training_at_3() -> bool:
        worlds = elastic.worlds(sorted(attempt.glob("*.log")))
        return bool(worlds) and worlds[-1][0] == 3 and bool(list(checkpoints.glob("step-*.pt")))

    frozen: list[int] = []
    try:
        out = _run_and(
            tmp_path,
            name,
            "job.yaml",
            training_at_3,
            lambda: frozen.extend(signal_pod(name, 0, signal.SIGSTOP)),
        )
    finally:
        for pid in frozen:  # nothing of it is left for the next tests, whatever happened
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert f"ddpjob local: {name}: Succeeded" in out and "after 1 attempt(s)" in out, out
    assert "it had left the world (silent, frozen or cut off), so its end is not the attempt's" in out, out
    assert f"still running {ending.FINISH_WAIT_SECONDS:.0f} s later" in out, out
    sizes = [size for size, _ in elastic.worlds(sorted(attempt.glob("*.log")))]
    assert sizes[-1] == 2 and 3 in sizes, sizes  # the survivors trained on without it, to the end
    assert "replicas verified bit-identical" in out, out
    assert not (tmp_path / "runs" / name / "attempt-2").exists()
    assert not pod_pids(name, 0) and not pod_pids(name, 1)


RIGID_BOUND_SECONDS = 60.0
"""Issue 54's bound for a rigid job: from the freeze to the start of the gang restart."""


@pytest.mark.slow
def test_a_frozen_pod_of_a_rigid_job_restarts_the_gang_within_the_bound_naming_it(tmp_path: Path) -> None:
    """A rigid job of two one-process pods; once it has saved a checkpoint, every process of pod 0 is frozen
    (SIGSTOP), its node still up: the pod whose agent hosts the rendezvous store, so pod 1's reads of the
    store get no answer (torch's client waits on past its own timeout; the watch gives its read up after
    the read timeout, 15 s). With spec.stallTimeoutSeconds (600 s) and the NCCL timeout (30 min) at their
    defaults, pod 1's agent judges node 0 silent, its pod fails naming it (its rendezvous shutdown, which the
    frozen store never answers, given up after 5 s), and the gang restarts as attempt 2 within the bound;
    attempt 2 resumes from the checkpoint and Succeeds."""
    name = unique_name()
    trainer = {"steps": 300, "batchSize": 16, "checkpointEvery": 10}
    doc = job(name, nodes=2, procsPerNode=1, trainer=trainer, syncCheck={"everySteps": 20})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    run = tmp_path / "runs" / name
    argv = [sys.executable, "-m", "ddp_operator", "local", "job.yaml", "--workdir", "runs"]
    process = subprocess.Popen(
        argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    frozen: list[int] = []
    started = time.monotonic()

    def seen() -> str:
        """The first attempt's pod logs, the last lines of each: what a missed deadline saw."""
        return "\n".join(
            f"--- {log.name}:\n" + "\n".join(log.read_text().splitlines()[-15:])
            for log in sorted((run / "attempt-1").glob("*.log"))
        )

    try:
        while not list((run / "volumes" / "checkpoint").glob("step-*.pt")):
            assert process.poll() is None and time.monotonic() - started < RUN_SECONDS, (
                f"no checkpoint in {time.monotonic() - started:.0f} s\n{seen()}"
            )
            time.sleep(0.1)
        frozen_at = time.monotonic()
        frozen = signal_pod(name, 0, signal.SIGSTOP)
        while not (run / "attempt-2").exists():
            assert process.poll() is None, f"the run ended before a second attempt\n{seen()}"
            assert time.monotonic() - frozen_at < RIGID_BOUND_SECONDS, (
                f"no gang restart within {RIGID_BOUND_SECONDS:.0f} s of the freeze\n{seen()}"
            )
            time.sleep(0.1)
        restarted_in = time.monotonic() - frozen_at
        out, _ = process.communicate(timeout=max(1.0, started + RUN_SECONDS - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the run did not end in time; it printed:\n{stop_job(process, name)}") from None
    finally:
        for pid in frozen:  # whatever the run left of them
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if process.poll() is None:
            stop_job(process, name)
    print(f"frozen → gang restart (attempt 2): {restarted_in:.1f} s (bound {RIGID_BOUND_SECONDS:.0f} s)")
    assert process.returncode == 0 and f"ddpjob local: {name}: Succeeded" in out, out
    said = (run / "attempt-1" / f"{name}-1-1.log").read_text()
    assert "127.0.0.1 (node 0, which hosts the rendezvous" in said and "went silent" in said, said
    assert "a rigid job cannot train without it" in said, said
    assert contract.SILENT_PEER in out, out  # the attempt's cause, as the summary says it


def _workers(job: str) -> dict[int, tuple[int, str]]:
    """``{pid: (node rank, process name)}`` of every live worker of the built-in trainer of ``job`` (a
    worker's name says its global rank: warm.WORKER_NAME_PREFIX). Names first, a cheap read of each
    process: a test polls this often, on two cores shared with the job."""
    found = {}
    for entry in Path("/proc").iterdir():
        named = _read(entry / "comm").decode(errors="replace").strip() if entry.name.isdigit() else ""
        if named.startswith(warm.WORKER_NAME_PREFIX):
            env = dict(
                item.split("=", 1)
                for item in _read(entry / "environ").decode(errors="replace").split("\0")
                if "=" in item
            )
            if env.get("DDPJOB_NAME") == job and env.get("NODE_RANK", "").isdigit():
                found[int(entry.name)] = (int(env["NODE_RANK"]), named)
    return found


@pytest.mark.slow
def test_a_node_lost_while_the_worlds_workers_start_is_let_go_within_the_bound(tmp_path: Path) -> None:
    """Three pods of one process; the store's process watch drops a SIGKILLed pod's agent at once, so it
    leaves the round with a fresh keep-alive, and no collective fails while the survivors' workers are still
    forming their group: each waits for the lost rank in the workers' store (30 minutes). Twice, each as
    soon as a new world of 3's workers exist (their rendezvous done, their group not formed yet):
    1. as the first world's start, the pod whose worker is rank 2 is SIGKILLed as soon as that worker
       exists (before it could join the workers' group: killed once all three existed, it sometimes had
       joined, and the loss failed a collective at once instead, a path proven elsewhere). rank 0's worker
       waits for it in the store it hosts, the others wait for rank 0's group: the survivors' agents see a
       member of their round gone while their workers have not said their group formed, stop them and meet
       the next round: a smaller world within the bound (it hung until the replacement joined before);
    2. as the world grown back by the replacement starts, the pod of its rank 0 (whose worker hosts the
       workers' store) is SIGKILLed: the survivors' agents see the round's host gone while their workers
       still run, and meet the next round (it hung until the replacement joined, issue 54's real-node e2e);
       a survivor's worker already connected to that store fails at once instead, which is as good.
    The replacements grow the world back; one attempt, no restart counted. The model
    (slow_factories.slow_until_full) is slow in a world smaller than 3, so the grow comes before the end.
    The job does not heal (``DDPJOB_HEAL=0``): a world healed back to 3 starts no new workers but the
    joiner's, and the second loss needs a whole world's workers starting."""
    name = _three_pods(
        tmp_path, steps=240, checkpoint_every=20, heal=False, model="slow_factories:slow_until_full"
    )
    attempt = tmp_path / "runs" / name / "attempt-1"
    argv = [sys.executable, "-m", "ddp_operator", "local", "job.yaml", "--workdir", "runs"]
    process = subprocess.Popen(
        argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    started = time.monotonic()

    def said() -> str:
        return "\n".join(_read(log).decode(errors="replace") for log in sorted(attempt.glob("*.log")))

    def worlds() -> list[tuple[int, int]]:
        return elastic.worlds(sorted(attempt.glob("*.log")))

    def lose_as_workers_start(rank_0: bool, seen: set[int]) -> tuple[int, float, int]:
        """Once a world of 3 starts (a worker not in ``seen`` on each pod: a round forms only after each of
        its members stopped its last workers, so these are one world's), SIGKILL the pod whose worker is rank
        0 (``rank_0``) or one whose worker is not; (that pod, the seconds to the next world verified, its
        size in ranks). A world of 2 meanwhile (under load a joining pod may miss a round) is passed over:
        with all three pods in the world, none waits to join when the loss comes."""
        while True:
            new = {pid: found for pid, found in _workers(name).items() if pid not in seen}
            pods = {node for node, _ in new.values()}
            hosts = {node for node, worker in new.values() if worker == f"{warm.WORKER_NAME_PREFIX}0"}
            if rank_0:
                chosen = sorted(hosts) if len(pods) == 3 else []
            else:  # rank 2's worker, at first sight (it names itself before anything else): a world of 3
                # whose group it has not joined yet, however fast the others' workers form theirs
                chosen = sorted(n for n, w in new.values() if w == f"{warm.WORKER_NAME_PREFIX}2")
            if chosen:
                break
            if process.poll() is not None or time.monotonic() - started > RUN_SECONDS:
                raise AssertionError(f"no world of 3 started; it printed:\n{stop_job(process, name)}")
            time.sleep(0.05)
        verified = len(worlds())
        signal_pod(name, chosen[0], signal.SIGKILL)
        lost_at = time.monotonic()
        while len(worlds()) == verified:
            if process.poll() is not None or time.monotonic() - lost_at > SILENT_BOUND_SECONDS:
                raise AssertionError(
                    f"no world verified within {SILENT_BOUND_SECONDS:.0f} s of losing pod {chosen[0]} "
                    f"(rank 0's: {rank_0}); the pods logged:\n{said()}\n`ddpjob local` printed:\n"
                    f"{stop_job(process, name)}"
                )
            time.sleep(0.1)
        seen.update(new, _workers(name))  # the next world of 3 to start is the grown one's
        return chosen[0], time.monotonic() - lost_at, worlds()[verified][0]

    try:
        seen: set[int] = set()
        other, other_in, other_left = lose_as_workers_start(rank_0=False, seen=seen)
        host, host_in, host_left = lose_as_workers_start(rank_0=True, seen=seen)
        out, _ = process.communicate(timeout=max(1.0, started + RUN_SECONDS - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the run did not end in time; it printed:\n{stop_job(process, name)}") from None
    finally:
        if process.poll() is None:
            stop_job(process, name)
    logs = said()
    print(f"pod {other} (not rank 0's) lost as the workers started → world of {other_left}: {other_in:.1f} s")
    print(f"pod {host} (rank 0's) lost as the grown world started → world of {host_left}: {host_in:.1f} s")
    assert other_left < 3, (other_left, out)  # the replacement comes 10 s after the loss, plus its start
    assert process.returncode == 0, out
    assert f"ddpjob local: {name}: Succeeded" in out and "after 1 attempt(s)" in out, out
    # the first loss is seen by the survivors' launchers alone (rank 0's worker waits in the store it hosts);
    # rank 0's, by them or, where a survivor's worker had already connected to that store, by its failure
    assert "before this node's workers formed their group" in logs, logs
    how = "its host lost" if "hosts the workers' store" in logs else "a worker's store failed"
    print(f"rank 0's pod lost: seen as {how}")
    assert "gang restart in place" not in logs, logs
