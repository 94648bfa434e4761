"""`ddpjob local` with checkpoints in object storage (spec.checkpoint.s3) on a real S3 server (MinIO,
tests/helpers/s3server.py): a pod killed mid-run restarts the gang, which resumes from the bucket; another job
pointed at the same prefix is refused at once; wrong credentials fail at once, saying why, without a
restart and without the secret in the output. Local mode reads the credentials from this machine's
environment (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``), as the pods' client chain does."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_trainer import contract
from helpers.local_jobs import finish_run, job, launcher_pid, run_local, start_run, unique_name
from helpers.s3server import S3Server

pytestmark = pytest.mark.slow


def _first_checkpoint(server: S3Server, bucket: str, process: Any, timeout: float = 120) -> str:
    client: Any = server.client()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # waits for the first object, at most ``timeout`` s
        found = [o.object_name for o in client.list_objects(bucket, prefix="team/step-")]  # not a fence
        if found:
            return str(found[0])
        assert process.poll() is None, "ddpjob local ended before its first checkpoint"
        time.sleep(0.1)
    raise AssertionError(f"no checkpoint in s3://{bucket}/team/ after {timeout}s")


def _report(tmp_path: Path, name: str, attempt: int) -> dict[str, Any]:
    path = tmp_path / "runs" / name / f"attempt-{attempt}" / f"{name}-{attempt}-0.termination-log"
    found: dict[str, Any] = yaml.safe_load(path.read_text())
    return found


def test_a_killed_pod_resumes_from_the_bucket_and_another_job_there_is_refused(
    tmp_path: Path, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)  # this machine's environment reaches the local pods
    bucket = s3_server.bucket()
    s3 = {"s3": {"endpoint": s3_server.endpoint, "bucket": bucket, "prefix": "team"}}
    name = unique_name()
    trainer = {"steps": 160, "batchSize": 16, "checkpointEvery": 20}
    process = start_run(tmp_path, job(name, trainer=trainer, checkpoint=s3))
    assert _first_checkpoint(s3_server, bucket, process).startswith("team/step-")
    os.kill(launcher_pid(name, 1), signal.SIGKILL)
    code, out = finish_run(process)
    assert code == 0, out
    assert "attempt 1 failed (node 1 was killed by SIGKILL (exit -9)); gang restart 1 of 3" in out, out
    assert f"ddpjob local: {name}: Succeeded" in out and "after 2 attempt(s)" in out, out
    assert _report(tmp_path, name, 2)["resumedFromStep"] > 0
    client: Any = s3_server.client()
    kept = sorted(o.object_name for o in client.list_objects(bucket, prefix="team/step-"))
    assert [re.sub(r"\.w\d+\.pt$", ".pt", k) for k in kept] == [
        f"team/step-00000140.{name}.pt",
        f"team/step-00000160.{name}.pt",
    ], kept  # keep: 2 (named with the world that wrote them from the second on: .w2)
    fenced = sorted(o.object_name for o in client.list_objects(bucket, prefix="team/fence-"))
    assert fenced and all(f.endswith(f".{name}.json") for f in fenced), fenced  # one per world (at most 4)

    other = unique_name()
    code, out = run_local(tmp_path, [job(other, trainer=trainer, checkpoint=s3)])
    assert code == 1 and "after 1 attempt(s)" in out, out  # no restart
    assert f"{contract.FOREIGN_CHECKPOINT}: attempt 1: checkpoint step-00000160.{name}." in out, out
    assert f"s3://{bucket}/team/" in out


def test_wrong_credentials_fail_at_once_without_a_restart_or_the_secret(
    tmp_path: Path, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = "not-the-secret-key-at-all"
    for key, value in s3_server.env(AWS_SECRET_ACCESS_KEY=wrong).items():
        monkeypatch.setenv(key, value)
    bucket = s3_server.bucket()
    s3 = {"s3": {"endpoint": s3_server.endpoint, "bucket": bucket}}
    name = unique_name()
    started = time.monotonic()
    code, out = run_local(tmp_path, [job(name, checkpoint=s3)])
    took = time.monotonic() - started
    assert code == 1 and "after 1 attempt(s)" in out, out  # a configuration error: no restart
    assert f"{contract.CHECKPOINT_STORAGE_REFUSED}: " in out and "SignatureDoesNotMatch" in out, out
    assert wrong not in out
    report = _report(tmp_path, name, 1)
    assert (report["result"], report["reason"]) == (contract.FAILED, contract.CHECKPOINT_STORAGE_REFUSED)
    print(f"refused {took:.1f}s after `ddpjob local` started")
