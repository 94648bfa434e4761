"""The launcher environment (:mod:`ddp_trainer.core.distributed`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from ddp_trainer import contract
from ddp_trainer.core.distributed import metrics_dir, process_start, read_launch_env
from ddp_trainer.core.inplace import LaunchState, write_state


def test_launcher_environment() -> None:
    launch = read_launch_env({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "GROUP_RANK": "2"})
    assert (launch.rank, launch.local_rank, launch.world_size, launch.node_rank, launch.launched) == (
        5,
        1,
        8,
        2,
        True,
    )
    assert not read_launch_env({}).launched


def test_metrics_dir_is_one_process_not_one_pid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory left in /tmp by a dead process whose pid is reused is not this run's (CI saw a
    run serve the series a dead job's pod had left under the same pid)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    launch = read_launch_env({"RANK": "0", "TORCHELASTIC_RESTART_COUNT": "2"})
    stale = tmp_path / f"ddpjob-metrics-{os.getppid()}-2"  # the old key: agent pid and restart count
    stale.mkdir()
    env: dict[str, str] = {}
    path = metrics_dir(env, launch)
    assert path.is_dir() and path != stale and env["PROMETHEUS_MULTIPROC_DIR"] == str(path)
    assert path.name == f"ddpjob-metrics-{os.getppid()}-{process_start(os.getppid())}-2-0"
    # the local ranks of one agent share it; a process's start time does not change
    assert metrics_dir({}, launch) == path
    assert metrics_dir({}, read_launch_env({})).name.startswith(f"ddpjob-metrics-{os.getpid()}-")


def test_process_start_reads_proc_and_survives_its_absence() -> None:
    started = int(process_start(os.getpid()))
    with open("/proc/uptime") as f:
        uptime_ticks = float(f.read().split()[0]) * os.sysconf("SC_CLK_TCK")
    assert 0 < started <= uptime_ticks + 1
    assert process_start(2**22 + 1) == "0"  # above pid_max: no such process


def test_metrics_dir_is_new_for_each_elastic_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A world change starts new workers under the same restart count; the files a dead worker wrote keep
    its ``ddp_info`` at 1 for the old world's size, so the new world's workers write to a directory of their
    own (the launcher's count of world changes, from its state file). CI's kubectl-scale drill saw the
    operator read a world of 3 for minutes after it shrank to 1."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    state = tmp_path / "launch-state.json"
    launch = read_launch_env({"RANK": "0", "TORCHELASTIC_RESTART_COUNT": "0"})
    env = {contract.LAUNCH_STATE_ENV: str(state)}
    write_state(state, LaunchState())
    first = metrics_dir(dict(env), launch)
    write_state(state, LaunchState(resizes=1, resize=contract.RESIZE_LOST, resize_from=3, resize_to=1))
    second = metrics_dir(dict(env), launch)
    assert first.name.endswith("-0-0") and second.name.endswith("-0-1") and first != second
    assert metrics_dir(dict(env), launch) == second  # the local ranks of one world share it
