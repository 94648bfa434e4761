"""local.host: the run folder of `ddpjob local` (resume unless the last run succeeded)."""

from __future__ import annotations

from pathlib import Path

from ddp_operator.local import host


def test_run_dir_resumes_unless_the_last_run_succeeded(tmp_path: Path) -> None:
    checkpoint = tmp_path / "volumes" / "checkpoint"
    checkpoint.mkdir(parents=True)
    (checkpoint / "step-00000020.pt").write_bytes(b"x")
    host.write_state(tmp_path, "Interrupted")
    note = host.prepare_run_dir(tmp_path, fresh=False)
    assert note is not None and "resuming" in note and "Interrupted" in note
    assert (checkpoint / "step-00000020.pt").exists()
    host.write_state(tmp_path, "Succeeded")
    assert host.prepare_run_dir(tmp_path, fresh=False) is None
    assert not tmp_path.exists()
