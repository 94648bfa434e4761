"""What a launcher reads of its workers' marks (launch/workers.py): whether their group formed, and whether
workers signalled to stop can still reach a step boundary; a stuck worker is stopped after the bound, one
that reaches a boundary or writes a checkpoint is left to torch's wait."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_trainer import contract
from ddp_trainer.core import inplace
from ddp_trainer.launch import workers


def _mark(directory: Path, pid: int, note: str) -> None:
    inplace.mark_worker(
        inplace.worker_mark({contract.LAUNCH_STATE_ENV: str(directory / "launch.json")}, pid), note
    )


def test_workers_that_leave_marks_start_until_one_says_its_group_formed(tmp_path: Path) -> None:
    marks = workers.Marks(tmp_path)
    assert not marks.starting([11, 12])  # a user's script that leaves none: not known to start
    marks.builtin = True
    assert marks.starting([11, 12]) and not marks.starting([])
    _mark(tmp_path, 12, inplace.FORMED)
    assert not marks.starting([11, 12])
    marks.clear()  # a new round: the last one's marks go
    assert not list(tmp_path.glob("worker-*")) and marks.starting([11, 12])
    user = workers.Marks(tmp_path)  # a user's script with SyncHealth: a mark seen once, expected after
    _mark(tmp_path, 13, inplace.FORMED)
    assert not user.starting([13]) and user.reported
    user.clear()
    assert user.starting([14])


def test_after_a_signal_only_workers_that_pass_no_step_boundary_within_the_bound_are_stuck() -> None:
    at = 1000.0
    bound = workers.STOP_BOUND_SECONDS
    assert workers.after_signal([None], at, at + bound - 0.1) == workers.WAIT
    assert workers.after_signal([None], at, at + bound) == workers.STUCK  # never formed: nothing to save
    assert workers.after_signal([("0.010", at - 0.5)], at, at + bound) == workers.STUCK  # in a collective
    assert workers.after_signal([("0.010", at + 0.2)], at, at + 1) == workers.BOUNDARY  # a step since
    assert workers.after_signal([(inplace.STOPPING, at - 9)], at, at + 60) == workers.BOUNDARY
    assert workers.after_signal([(inplace.SAVING, at - 9)], at, at + 60) == workers.BOUNDARY  # rank 0 writes
    assert workers.after_signal([("4.000", at - 1)], at, at + bound + 1) == workers.WAIT  # long steps
    assert workers.after_signal([("4.000", at - 1)], at, at + 12) == workers.STUCK


def test_a_worker_that_cannot_reach_a_step_boundary_is_killed_and_one_that_does_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workers, "STOP_BOUND_SECONDS", 1.0)  # the unit suite's time
    # a worker that ignores SIGTERM (as one waiting in a collective, which acts on it only at a boundary)
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, lambda *_: None); print(1, flush=True); "
        "time.sleep(60)"
    )
    stuck = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert stuck.stdout is not None and stuck.stdout.readline()
    _mark(tmp_path, stuck.pid, "0.010")
    os.utime(tmp_path / f"worker-{stuck.pid}", (time.time() - 1, time.time() - 1))
    said: list[str] = []
    started = time.monotonic()
    assert (
        workers.stop_promptly([stuck.pid], workers.Marks(tmp_path, builtin=True), say=said.append) == "stuck"
    )
    assert stuck.wait(5) == -signal.SIGKILL
    assert workers.STOP_BOUND_SECONDS <= time.monotonic() - started < workers.STOP_BOUND_SECONDS + 2
    assert "passed no step boundary" in said[0], said
    saving = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert saving.stdout is not None and saving.stdout.readline()
    _mark(tmp_path, saving.pid, inplace.SAVING)  # rank 0 writing a checkpoint: torch's agent waits for it
    assert workers.stop_promptly([saving.pid], workers.Marks(tmp_path, builtin=True)) == "boundary"
    assert saving.poll() is None
    saving.kill()
    saving.wait()
