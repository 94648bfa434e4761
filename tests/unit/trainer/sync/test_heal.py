"""A worker's side of a heal without a process group: when it is armed, and how it waits for the notice
(the heal itself, with real processes: tests/integration/trainer/test_heal_multiprocess.py)."""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_trainer.core import inplace, notice, reform
from ddp_trainer.sync import heal
from ddp_trainer.sync.heal import Healer

LOSS = RuntimeError("[pair.cc:545] Read error [127.0.0.1]:1: Connection reset by peer")


def _env(tmp_path: Path) -> dict[str, str]:
    return {"DDPJOB_LAUNCH_STATE": str(tmp_path / "launch-state.json"), "LOCAL_RANK": "1"}


def _notice(round_: int) -> notice.Notice:
    return notice.Notice(round_, {1: 0}, 1, 0, 1, "127.0.0.1", 1)


def test_without_a_launcher_nothing_heals() -> None:
    healer = Healer({})
    assert healer.path is None and not healer.wanted(LOSS)


def test_under_a_launcher_only_a_peer_loss_heals(tmp_path: Path) -> None:
    healer = Healer(_env(tmp_path))
    assert healer.wanted(LOSS) and not healer.wanted(RuntimeError("CUDA out of memory"))
    assert healer.local_rank == 1 and healer.round == -1


def test_a_worker_marks_heal_wanted_and_takes_the_next_notice(tmp_path: Path) -> None:
    env = _env(tmp_path)
    notice.write_notice(tmp_path / notice.NOTICE_FILE, _notice(2))  # one before this worker started
    healer = Healer(env, wait_seconds=10)
    assert healer.round == 2
    later = threading.Timer(0.3, notice.write_notice, (tmp_path / notice.NOTICE_FILE, _notice(3)))
    later.start()
    assert healer.await_notice() == _notice(3)
    assert (tmp_path / f"worker-{os.getpid()}").read_text() == notice.HEAL_WANTED


def test_no_newer_notice_in_time_is_none(tmp_path: Path) -> None:
    notice.write_notice(tmp_path / notice.NOTICE_FILE, _notice(2))
    healer = Healer(_env(tmp_path), wait_seconds=0.3)
    started = time.monotonic()
    assert healer.await_notice() is None
    assert 0.3 <= time.monotonic() - started < 2


def test_a_failed_heal_says_why_in_the_mark(tmp_path: Path) -> None:
    healer = Healer(_env(tmp_path))
    error = healer.fail(3, "the survivors are at steps 1 to 3")
    assert "steps 1 to 3" in str(error)
    note = notice.read_note((tmp_path / f"worker-{os.getpid()}").read_text())
    assert note == notice.Note(notice.HEAL_FAILED, 3, why="the survivors are at steps 1 to 3")


def test_a_healed_module_is_wrapped_again_with_the_old_wrappers_options() -> None:
    store = reform.bootstrap_store("127.0.0.1", 0, 0, 1, timedelta(seconds=10))
    try:
        reform.reform(store, reform.World(0, 1, reform.DEFAULT_PREFIX), timeout=timedelta(seconds=10))
        module = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            old = DistributedDataParallel(module, broadcast_buffers=False, find_unused_parameters=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the deprecated switch's warning is muted
            new = heal._wrap(module, old)
        assert new.module is module and new is not old
        assert (new.forward_sync_buffers, new.find_unused_parameters) == (False, True)
        assert heal._wrap(module, DistributedDataParallel(module)).forward_sync_buffers
        assert isinstance(heal._wrap(module, module), DistributedDataParallel)
    finally:
        reform.abandon_group()


def test_the_heal_drill_nudges_the_named_rank_of_the_healed_world_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    healer = Healer(_env(tmp_path) | {"DDPJOB_CHAOS_HEAL_NUDGE": "rank=1"})
    module = nn.Linear(3, 2)
    before = [p.detach().clone() for p in module.parameters()]
    healer.drill(module, 0, True)  # another rank: nothing
    healer.drill(module, 1, False)  # a grow's heal (it may come first, at the start): nothing
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))
    with caplog.at_level(logging.WARNING, logger="ddp_trainer"):
        healer.drill(module, 1, True)
    assert "fire drill: rank 1 nudges its parameters during the heal" in caplog.text
    nudged = [p.detach().clone() for p in module.parameters()]
    changed = [int((a != b).sum()) for a, b in zip(before, nudged, strict=True)]
    assert changed == [1, 0], changed  # one element of one parameter
    healer.drill(module, 1, True)  # once: the restart in place the refused heal causes does not repeat it
    assert all(torch.equal(a, b) for a, b in zip(nudged, module.parameters(), strict=True))


@pytest.mark.parametrize("later", [{"DDPJOB_ATTEMPT": "2"}, {}], ids=["attempt-2", "restarted-in-place"])
def test_the_heal_drill_fires_in_the_first_run_of_attempt_1_only(
    tmp_path: Path, later: dict[str, str]
) -> None:
    env = _env(tmp_path) | {"DDPJOB_CHAOS_HEAL_NUDGE": "rank=0"}
    assert Healer(env).nudge == 0 and Healer(_env(tmp_path)).nudge is None
    if not later:  # the launcher restarted this pod's workers in place once
        inplace.write_state(tmp_path / "launch-state.json", inplace.LaunchState(restarts=1, cause="x"))
    assert Healer(env | later).nudge is None
