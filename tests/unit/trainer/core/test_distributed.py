"""The launcher environment (:mod:`ddp_trainer.core.distributed`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from ddp_trainer.core.distributed import metrics_dir, process_start, read_launch_env


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
    assert path.name == f"ddpjob-metrics-{os.getppid()}-{process_start(os.getppid())}-2"
    # the local ranks of one agent share it; a process's start time does not change
    assert metrics_dir({}, launch) == path
    assert metrics_dir({}, read_launch_env({})).name.startswith(f"ddpjob-metrics-{os.getpid()}-")


def test_process_start_reads_proc_and_survives_its_absence() -> None:
    started = int(process_start(os.getpid()))
    with open("/proc/uptime") as f:
        uptime_ticks = float(f.read().split()[0]) * os.sysconf("SC_CLK_TCK")
    assert 0 < started <= uptime_ticks + 1
    assert process_start(2**22 + 1) == "0"  # above pid_max: no such process
