"""`ddpjob local` and checkpoints that say who wrote them: the run folder's identity is stable across reruns
of one file, and another job pointed at the same folder is refused at once, as on a cluster."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_trainer import contract
from ddp_trainer.checkpoint import provenance

pytestmark = pytest.mark.slow


def _job(name: str, folder: Path, **checkpoint: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ddpjob.io/v1alpha1",
        "kind": "DDPJob",
        "metadata": {"name": name},
        "spec": {
            "nodes": 1,
            "procsPerNode": 2,
            "device": "cpu",
            "maxRestarts": 3,
            "trainer": {"steps": 20, "batchSize": 16, "checkpointEvery": 10},
            "syncCheck": {"everySteps": 10},
            "checkpoint": {"volume": {"hostPath": {"path": str(folder)}}, **checkpoint},
        },
    }


def _local(tmp_path: Path, doc: dict[str, Any]) -> tuple[int, str]:
    path = tmp_path / f"{doc['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    cmd = [sys.executable, "-m", "ddp_operator", "local", str(path), "--workdir", str(tmp_path / "runs")]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def test_another_local_job_in_the_same_folder_is_refused_and_a_warm_start_is_not(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    a, b = f"a{uuid.uuid4().hex[:6]}", f"b{uuid.uuid4().hex[:6]}"
    code, out = _local(tmp_path, _job(a, folder))
    assert code == 0, out
    header, _ = provenance.decode((folder / f"step-00000020.{a}.pt").read_bytes())
    assert header.identity == provenance.Identity("default", a, "00000000-0000-0000-0000-000000000000")

    code, out = _local(tmp_path, _job(b, folder))
    assert code == 1, out
    assert f"ddpjob local: {b}: Failed" in out and "after 1 attempt(s)" in out, out  # no restart
    assert f"{contract.FOREIGN_CHECKPOINT}: attempt 1: checkpoint step-00000020.{a}.pt" in out
    assert f"was written by DDPJob default/{a} (uid 00000000-0000-0000-0000-000000000000)" in out
    report = yaml.safe_load((tmp_path / "runs" / b / "attempt-1" / f"{b}-1-0.termination-log").read_text())
    assert (report["result"], report["reason"]) == (contract.FAILED, contract.FOREIGN_CHECKPOINT)

    code, out = _local(tmp_path, _job(b, folder, warmStartFrom=a))
    assert code == 0, out
    # the second run's attempts follow the first's, whose logs stay
    report = yaml.safe_load((tmp_path / "runs" / b / "attempt-2" / f"{b}-2-0.termination-log").read_text())
    assert (report["warmStartedFrom"], report["resumedFromStep"], report["step"]) == (f"default/{a}", 0, 20)
