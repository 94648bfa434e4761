"""The pods of one local attempt (:mod:`ddp_operator.local.gang`), with real processes: a stop waits for the
pods and whatever carries the run's marker, but not for a spared process (the rendezvous store, which its
keeper stops after the pods)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from ddp_operator.local import gang

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def _sleeper(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(SLEEP, env=env, start_new_session=True)


def _stopped(tmp_path: Path, marker: str, store: subprocess.Popen[bytes], grace: float) -> float:
    """A gang of one pod that exited 0, the store spared: the seconds its stop took."""
    env = {**os.environ, gang.MARKER: marker}
    members = gang.Gang(marker)
    members.spared = lambda: (store.pid,)
    members.start(gang.Member("pod-0", [sys.executable, "-c", "pass"], env, tmp_path / "pod-0.log", print))
    while members.codes() != [0]:
        time.sleep(0.05)
    began = time.monotonic()
    members.stop(grace_seconds=grace)
    return time.monotonic() - began


def test_a_stop_neither_waits_for_nor_kills_a_spared_marked_process(tmp_path: Path) -> None:
    """The end of every elastic `ddpjob local` run waited out the 30 s grace period for the store (it
    carries the marker, to be found if ddpjob itself dies) and then killed it under its keeper, which
    started it again and said that it could not (CI's users-elastic-script run: 33 s from the last step
    to the summary)."""
    marker = uuid.uuid4().hex
    env = {**os.environ, gang.MARKER: marker}
    store, stray = _sleeper(env), _sleeper(env)  # the stray: a marked process nobody spares
    try:
        took = _stopped(tmp_path, marker, store, grace=1.0)
        assert stray.wait(timeout=5) == -9  # a marked process that is not spared is killed at the deadline
        assert took < 1.0 + 5, took
        assert store.poll() is None, "the spared store was killed with the pods"
        assert gang.marked(marker) == [store.pid]
    finally:
        for process in (store, stray):
            process.kill()
            process.wait()


def test_a_stop_with_only_a_spared_process_left_returns_at_once(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    store = _sleeper({**os.environ, gang.MARKER: marker})
    try:
        # not the grace period: nothing but the store was left
        assert _stopped(tmp_path, marker, store, grace=20.0) < 5.0
        assert store.poll() is None
    finally:
        store.kill()
        store.wait()


def test_a_stop_does_not_wait_out_the_grace_period_for_a_frozen_process(tmp_path: Path) -> None:
    """A frozen pod (SIGSTOP) cannot act on its SIGTERM: once every process left is stopped, the stop kills
    them instead of waiting 20 s (a rigid job's frozen pod cost ddpjob local 30 s before its next attempt)."""
    import signal

    marker = uuid.uuid4().hex
    env = {**os.environ, gang.MARKER: marker}
    store, frozen = _sleeper(env), _sleeper(env)
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        while not gang._stopped(frozen.pid):  # the kernel says it stopped
            time.sleep(0.01)
        assert _stopped(tmp_path, marker, store, grace=20.0) < 5.0
        assert frozen.wait(timeout=5) == -9 and store.poll() is None
    finally:
        for process in (store, frozen):
            process.kill()
            process.wait()
