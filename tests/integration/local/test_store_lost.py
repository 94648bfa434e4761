"""`ddpjob local` of an elastic DDPJob whose rendezvous store is lost mid-run (issue 54, item 5): the store's
process is started again (as the store's Job replaces a lost pod), the running pods' launchers give the new,
empty store their round back, and the world trains on through it, re-forming at the next resize, in the
same attempt; a world change while no store answers waits for it. And the pure part of
local/elastic.KeptStore."""

from __future__ import annotations

import contextlib
import os
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
from helpers.local_jobs import job, launcher_pid, pod_pids, pods_pythonpath, unique_name

RESTORED = "[launcher] the rendezvous store came back empty: restored round "
RECONNECTED = "[launcher] reconnected to the rendezvous store"
WAITS = "does not answer as this node meets the others at the next round"
MET = "this node met the others at the next round"
SHRUNK = "the world changed from 3 to 2 node(s)"
GREW = "the world changed from 2 to 3 node(s)"
HELPERS = Path(__file__).resolve().parents[2] / "helpers"
FROZEN_AFTER_RESTORE_SECONDS = 10.0
"""How long pod 2's launcher stays frozen after another restored the round at the new store: past the
silence watch's judgement (keep-alive bound 5 s and margin 1 s) with polls to spare; before the restore's
hold (30 s) ends."""


class _Process:
    """A stand-in for the store's Popen: ended with ``code`` once ``end()`` is called."""

    def __init__(self) -> None:
        self.code: int | None = None

    def poll(self) -> int | None:
        return self.code

    def terminate(self) -> None:
        self.code = -15

    def wait(self, timeout: float) -> int | None:
        return self.code


def test_a_store_whose_process_ends_is_started_again_saying_so_each_time_up_to_a_limit(
    tmp_path: Path,
) -> None:
    started: list[_Process] = []
    said: list[str] = []

    def start(port: int, env: Any, log: Path, append: bool = False) -> _Process:
        assert append == bool(started), "a store started again appends to the first one's log"
        started.append(_Process())
        return started[-1]

    kept = elastic.KeptStore(4321, {}, tmp_path / "store.log", said.append, start=start, watch=False)
    assert kept.check() and len(started) == 1 and not said  # alive: nothing to do
    started[-1].code = -9
    assert kept.check() and len(started) == 2 and kept.process is started[-1]
    assert said == [
        "the rendezvous store's process was killed by SIGKILL (exit -9): a new one serves :4321, as the "
        "store's Job replaces a lost pod; it starts empty, and the pods' launchers give it back their round"
    ]
    for _ in range(elastic.KEEP_AT_MOST - 1):
        started[-1].code = 1
        assert kept.check()
    started[-1].code = 1
    assert not kept.check() and len(started) == elastic.KEEP_AT_MOST + 1
    assert "not started again" in said[-1], said
    kept.stop()


def test_a_stopped_keeper_does_not_start_the_store_again(tmp_path: Path) -> None:
    started: list[_Process] = []

    def start(port: int, env: Any, log: Path, append: bool = False) -> _Process:
        started.append(_Process())
        return started[-1]

    kept = elastic.KeptStore(4321, {}, tmp_path / "store.log", print, start=start, watch=False)
    kept.stop()
    assert started[0].code == -15 and kept.check() and len(started) == 1


def test_a_gated_store_is_started_again_only_once_its_gate_opens_each_time(tmp_path: Path) -> None:
    started: list[_Process] = []

    def start(port: int, env: Any, log: Path, append: bool = False) -> _Process:
        started.append(_Process())
        return started[-1]

    gate = tmp_path / "gate"
    kept = elastic.KeptStore(4321, {}, tmp_path / "store.log", print, start=start, watch=False, gate=gate)
    for _ in range(2):  # each loss waits for the gate again
        started[-1].code = -9
        assert kept.check() and kept.check() and len(started) in (1, 2) and started[-1].code == -9
        gate.touch()
        assert kept.check() and started[-1].code is None and not gate.exists()
    assert len(started) == 3
    kept.stop()


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _store_of(parent: int) -> int:
    """The PID of the rendezvous store process ``ddpjob local`` (``parent``) started."""
    (store,) = [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit()
        and b"ddp_trainer.launch.store" in _read(entry / "cmdline")
        and _read(entry / "stat").rsplit(b")", 1)[-1].split()[1:2] == [str(parent).encode()]
    ]
    return store


def _end(name: str, process: subprocess.Popen[str]) -> None:
    """End a run that failed: its store, `ddpjob local` and every process of its pods (a SIGKILLed
    `ddpjob local` leaves them running)."""
    with contextlib.suppress(ValueError, OSError):
        os.kill(_store_of(process.pid), signal.SIGKILL)
    process.kill()
    for node in range(3):
        for pid in pod_pids(name, node):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_lost_store_costs_the_world_nothing_and_a_world_change_while_none_answers_waits_for_it(
    tmp_path: Path,
) -> None:
    """Three one-process pods (minNodes 1) whose store's replacement starts only when the test opens its
    gate (elastic.GATE_ENV: in a cluster the new pod takes seconds, and its name resolves only once ready).

    1. The store's process is SIGKILLed while a world of 3 trains, and pod 2's launcher is frozen (SIGSTOP)
       until well after the others restored the round at the new store: the nodes reach the new store one
       by one, as in the cluster (where the last came 13 s after the first, and was judged silent). Nothing
       re-forms: no silent verdict, no new world, no restart.
    2. The store is killed again, and pod 1's worker with it: every launcher's rendezvous fails with the
       store's error, and each waits for the store, saying so; once it answers they meet there and the
       world re-forms at 3 (a restart in place for rank 1's failure, or, where a loaded node missed the
       round's last call, a world of 2 and then 3), in the same attempt.
    3. Pod 2 is taken away (SIGTERM, a scale-down): the others re-form at 2 through the new store, and
       pod 2's replacement grows the world back to 3 there (its first rendezvous finds the restored round
       and the gather count). One attempt; every world verified."""
    name = unique_name()
    trainer = {"steps": 300, "batchSize": 16, "checkpointEvery": 10, "model": "slow_factories:paced"}
    fast = tmp_path / "drills-done"  # the last world of 3 trains at full speed (slow_factories.paced)
    doc = job(
        name,
        nodes=3,
        procsPerNode=1,
        elastic={"minNodes": 1, "maxNodes": 3},
        trainer=trainer,
        syncCheck={"everySteps": 20},
        env=[
            {"name": "PYTHONPATH", "value": pods_pythonpath(HELPERS)},
            {"name": "SLOW_FACTORIES_PACED_UNTIL", "value": str(fast)},
        ],
    )
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    attempt = tmp_path / "runs" / name / "attempt-1"
    gate = tmp_path / "store-gate"
    argv = [sys.executable, "-m", "ddp_operator", "local", "job.yaml", "--workdir", "runs"]
    started = time.monotonic()
    process = subprocess.Popen(
        argv,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, elastic.GATE_ENV: str(gate)},
    )
    frozen: list[int] = []

    def worlds() -> list[tuple[int, int]]:
        return elastic.worlds(sorted(attempt.glob("*.log")))

    def logs() -> dict[str, str]:
        return {path.name: _read(path).decode(errors="replace") for path in attempt.glob("*.log")}

    def pod(node: int) -> str:
        return logs().get(f"{name}-1-{node}.log", "")

    def wait_for(what: Callable[[], bool], seconds: float, said: str) -> None:
        deadline = time.monotonic() + seconds
        while not what():
            if process.poll() is not None or time.monotonic() > deadline:
                for pid in frozen:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGCONT)
                _end(name, process)
                out, _ = process.communicate()
                raise AssertionError(f"{said} within {seconds:.0f} s; worlds {worlds()}\n{out}")
            time.sleep(0.1)

    try:
        wait_for(lambda: bool(now := worlds()) and now[-1][0] == 3, 180, "no world of 3")
        seen = len(worlds())
        # 1. the store lost while pod 2's launcher cannot reach the new one
        reconnected = [pod(node).count(RECONNECTED) for node in range(3)]
        before = {log: len(text) for log, text in logs().items()}  # judged from here on (a loaded start
        # may drop a late node and re-form before the world of 3, as it would without the store's loss)
        frozen.append(launcher_pid(name, 2))
        os.kill(frozen[0], signal.SIGSTOP)
        os.kill(_store_of(process.pid), signal.SIGKILL)
        gate.touch()
        opened = time.monotonic()
        wait_for(lambda: RESTORED in pod(0) + pod(1), 60, "nobody restored the round at the new store")
        figures = [f"restored {time.monotonic() - opened:.1f} s after the first store's gate opened"]
        # frozen on past the keep-alive bound and margin (6 s) after the restore, with polls to spare: a
        # least time for the others to judge it, not a guess of when something happens
        frozen_until = time.monotonic() + FROZEN_AFTER_RESTORE_SECONDS
        wait_for(lambda: time.monotonic() >= frozen_until, 60, "the run ended while pod 2 was frozen")
        os.kill(frozen.pop(), signal.SIGCONT)
        woke = time.monotonic()
        wait_for(
            lambda: all(pod(node).count(RECONNECTED) > reconnected[node] for node in range(3)),
            60,
            "not every launcher reached the new store",
        )
        figures.append(f"pod 2 reached it {time.monotonic() - woke:.1f} s after it woke")
        assert len(worlds()) == seen, worlds()
        # 2. a world change while no store answers: pod 1's worker fails
        waiting = [pod(node).count(WAITS) for node in range(3)]
        met = [pod(node).count(MET) for node in range(3)]
        os.kill(_store_of(process.pid), signal.SIGKILL)
        (worker,) = [
            pid for pid in pod_pids(name, 1) if _read(Path(f"/proc/{pid}/comm")).startswith(b"ddpjob-rank-")
        ]
        os.kill(worker, signal.SIGKILL)
        wait_for(
            lambda: all(pod(node).count(WAITS) > waiting[node] for node in range(3)),
            60,
            "not every launcher said it waits for the store",
        )
        assert len(worlds()) == seen, worlds()
        gate.touch()
        opened = time.monotonic()
        wait_for(
            lambda: all(pod(node).count(MET) > met[node] for node in range(3)),
            120,
            "not every launcher met the others once the store answered",
        )
        # each met the others at the next round; under load one may miss that round's 2 s last call, as at
        # any restart in place, and join at the next (a world of 2, then 3)
        wait_for(lambda: worlds()[-1][0] == 3 and len(worlds()) > seen, 120, "no world of 3 again")
        figures.append(f"the world of 3 verified {time.monotonic() - opened:.1f} s after the second gate")
        # 3. a resize after the store's replacement: pod 2 taken away, then its replacement
        grown = len(worlds())
        fast.touch()
        os.kill(launcher_pid(name, 2), signal.SIGTERM)
        out, _ = process.communicate(timeout=400)
    finally:
        if process.poll() is None:
            _end(name, process)
    print(f"the job took {time.monotonic() - started:.0f} s; worlds {worlds()}; " + "; ".join(figures))
    assert process.returncode == 0, out
    assert f"ddpjob local: {name}: Succeeded" in out and "after 1 attempt(s)" in out, out
    assert out.count("the rendezvous store's process was killed by SIGKILL (exit -9): a new one serves") == 2
    after = [world for world, _ in worlds()[grown:]]
    assert after[-2:] == [2, 3] and 1 not in after, (worlds(), out)
    text = "\n".join(log[before.get(path, 0) :] for path, log in logs().items())
    assert text.count(RESTORED) == 2, text  # once per outage: the first launcher restored it
    assert "went silent" not in text and "dropped from its round" not in text, text
    assert "gang restart in place 2" not in text, text  # at most one restart: rank 1's failure
    log = pod(0)
    assert log.rfind(MET) < log.rfind(SHRUNK) < log.rfind(GREW), log  # the resize, through the new store
    assert "replicas verified bit-identical" in out, out
