"""local.host: the run folder of `ddpjob local` (resume unless the last run succeeded, whose folder is kept
beside)."""

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


def test_a_run_after_one_that_succeeded_starts_anew_and_keeps_the_earlier_one_beside_saying_where(
    tmp_path: Path,
) -> None:
    """Issue 58, item 6: nothing of the earlier run is deleted; each re-run sets the last aside."""
    run_dir = tmp_path / "quickstart"
    for number in (1, 2):
        (run_dir / "attempt-1").mkdir(parents=True)
        (run_dir / "attempt-1" / "quickstart-1-0.log").write_text(f"run {number}\n")
        host.write_state(run_dir, "Succeeded")
        note = host.prepare_run_dir(run_dir, fresh=False)
        kept = tmp_path / f"quickstart.earlier-{number}"
        assert note == (
            f"the earlier run Succeeded: its logs and checkpoints are kept in {kept}; this run starts anew"
        )
        assert (kept / "attempt-1" / "quickstart-1-0.log").read_text() == f"run {number}\n"
        assert (kept / "state").read_text() == "Succeeded\n"
        assert not run_dir.exists() and host.next_attempt(run_dir) == 1


def test_fresh_discards_an_earlier_unfinished_run(tmp_path: Path) -> None:
    (tmp_path / "volumes" / "checkpoint").mkdir(parents=True)
    host.write_state(tmp_path, "Failed")
    assert host.prepare_run_dir(tmp_path, fresh=True) is None
    assert not tmp_path.exists()


def test_fresh_sets_an_earlier_run_that_succeeded_aside_too(tmp_path: Path) -> None:
    """--fresh discards an unfinished run's checkpoint, never a finished run: that is kept beside."""
    run_dir = tmp_path / "quickstart"
    (run_dir / "volumes" / "checkpoint").mkdir(parents=True)
    (run_dir / "volumes" / "checkpoint" / "step-00000020.pt").write_bytes(b"x")
    host.write_state(run_dir, "Succeeded")
    note = host.prepare_run_dir(run_dir, fresh=True)
    kept = tmp_path / "quickstart.earlier-1"
    assert note is not None and str(kept) in note
    assert (kept / "volumes" / "checkpoint" / "step-00000020.pt").read_bytes() == b"x"
    assert not run_dir.exists()
