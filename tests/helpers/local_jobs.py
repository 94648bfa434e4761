"""Helpers for tests that run `ddpjob local` as a user would: a DDPJob file, the command, its output."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_trainer import contract

UNDER_LOAD = pytest.mark.flaky(reruns=1, only_rerun=["AssertionError"])
"""One rerun on a failed assertion, for the few tests whose scenario depends on timing that CPU starvation
changes (`make test` runs the cluster lane beside them on two cores): a survivor's rendezvous keep-alive
(1 s x 5) missed, or a rank's last words racing its peers'. docs/testing.md lists them; a failure twice
in a row is a failure."""


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


def run_local(
    tmp_path: Path, docs: list[dict[str, Any]], *extra: str, timeout: float = 240, workdir: str | None = None
) -> tuple[int, str]:
    """`ddpjob local FILE` on a file of ``docs``, run in ``tmp_path``, to the end; (exit code, everything it
    printed). ``workdir``: the ``--workdir`` as given (relative to ``tmp_path``), default ``runs``."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    done = subprocess.run(
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
        timeout=timeout,
        check=False,
    )
    return done.returncode, done.stdout


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


def launcher_pid(job: str, node_rank: int) -> int:
    """The launcher (torchrun's agent under ``ddp_trainer.launch``) of pod ``node_rank`` of ``job``."""
    launchers = [
        pid
        for pid, env, argv in processes_of(job)
        if env.get("NODE_RANK") == str(node_rank) and contract.LAUNCHER_MODULE in argv[:3]
    ]
    assert launchers, f"no launcher (torchrun) process for node {node_rank}"
    return launchers[0]
