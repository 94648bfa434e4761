"""Helpers for tests that run `ddpjob local` as a user would: a DDPJob file, the command, its output."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from ddp_trainer import contract


def unique_name() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


def job(name: str, **spec: Any) -> dict[str, Any]:
    """A small CPU DDPJob (2 nodes × 2 procs, 200 steps); ``spec`` replaces top-level spec fields."""
    base = {
        "nodes": 2,
        "procsPerNode": 2,
        "device": "cpu",
        "trainer": {"steps": 200, "batchSize": 16, "checkpointEvery": 20},
        "syncCheck": {"everySteps": 20},
    }
    return {
        "apiVersion": "ddpjob.io/v1alpha1",
        "kind": "DDPJob",
        "metadata": {"name": name},
        "spec": {**base, **spec},
    }


def pods_pythonpath(*directories: Path) -> str:
    """A ``PYTHONPATH`` value for a local job's ``spec.env``: ``directories`` (a model factory's), then the
    one this test runs under. The pod's replaces the test's, so without it a worktree's pods would import
    the trainer the Python environment installed (an editable install of another checkout), not the one
    under test."""
    return os.pathsep.join(filter(None, (*map(str, directories), os.environ.get("PYTHONPATH", ""))))


RUN_SECONDS = 540
"""How long a run may take, by default: generous (these runs take seconds to 3 min; up to 7 min were seen
on 2 cores shared with the Go and image builds) and under pytest's 600 s timeout (pyproject.toml), so that
a run that misses it fails saying what it printed instead of by pytest-timeout's stack dump."""


def run_local(
    tmp_path: Path,
    docs: list[dict[str, Any]],
    *extra: str,
    timeout: float = RUN_SECONDS,
    workdir: str | None = None,
) -> tuple[int, str]:
    """`ddpjob local FILE` on a file of ``docs``, run in ``tmp_path``, to the end; (exit code, everything it
    printed). ``workdir``: the ``--workdir`` as given (relative to ``tmp_path``), default ``runs``. A run
    that does not end within ``timeout`` is stopped (:func:`stop_job`) and fails saying what it printed."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddp_operator",
            "local",
            str(path),
            "--workdir",
            workdir if workdir is not None else str(tmp_path / "runs"),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
    )
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        name = next((d["metadata"]["name"] for d in docs if d.get("kind") == "DDPJob"), "")
        said = stop_job(process, name)
        raise AssertionError(f"`ddpjob local` did not end in {timeout:.0f} s; it printed:\n{said}") from None
    return process.returncode, out


def start_run(tmp_path: Path, doc: dict[str, Any], *extra: str) -> subprocess.Popen[str]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddp_operator",
            "local",
            str(path),
            "--workdir",
            str(tmp_path / "runs"),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
    )


def finish_run(process: subprocess.Popen[str], timeout: float = 240) -> tuple[int, str]:
    out, _ = process.communicate(timeout=timeout)
    return process.returncode, out


def stop_job(process: subprocess.Popen[str], job: str) -> str:
    """What `ddpjob local` (``process``, running DDPJob ``job``) printed, once it, its children (the pods'
    launchers, the rendezvous store) and every process of the job (frozen ones too) are SIGKILLed: a test
    that gives up on a run leaves nothing of it to load the next tests or hold their ports."""
    victims = [*_children(process.pid), *(pid for pid, _, _ in (processes_of(job) if job else []))]
    process.kill()
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    out, _ = process.communicate(timeout=60)
    return out


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_bytes() if entry.name.isdigit() else b""
        except OSError:
            continue
        if stat and int(stat.rsplit(b")", 1)[-1].split()[1]) == parent:
            found.append(int(entry.name))
    return found


def processes_of(job: str) -> Iterator[tuple[int, dict[str, str], list[str]]]:
    """(pid, environment, argv) of every live process started for the DDPJob named ``job``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "environ").read_bytes()
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
        if env.get("DDPJOB_NAME") == job:
            yield int(entry.name), env, argv


def pod_pids(job: str, node_rank: int) -> list[int]:
    """Every live process of pod ``node_rank`` of ``job``: its launcher, its fork server and its workers."""
    return [pid for pid, env, _ in processes_of(job) if env.get("NODE_RANK") == str(node_rank)]


def signal_pod(job: str, node_rank: int, sig: signal.Signals) -> list[int]:
    """``sig`` to every process of pod ``node_rank`` of ``job``, as a lost (SIGKILL) or frozen (SIGSTOP) node,
    scanning again until no new one shows (a worker its launcher started meanwhile); the PIDs signalled. A
    process gone before its signal is passed over; a pod with no process at all fails, naming it."""
    done: list[int] = []
    while new := [pid for pid in pod_pids(job, node_rank) if pid not in done]:
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        done += new
    assert done, f"no process of pod {node_rank}"
    return done


def launcher_pid(job: str, node_rank: int) -> int:
    """The launcher (torchrun's agent under ``ddp_trainer.launch``) of pod ``node_rank`` of ``job``."""
    launchers = [
        pid
        for pid, env, argv in processes_of(job)
        if env.get("NODE_RANK") == str(node_rank) and contract.LAUNCHER_MODULE in argv[:3]
    ]
    assert launchers, f"no launcher (torchrun) process for node {node_rank}"
    return launchers[0]
