"""`ddpjob local` says what happened: the failing rank's first error, configuration errors that fail at
once, and sync summaries that say "diverged" only for a divergence. Real torchrun, real trainer."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.local_jobs import job, run_local, unique_name

pytestmark = pytest.mark.slow


def test_a_bad_trainer_flag_fails_at_once_and_says_why(tmp_path: Path) -> None:
    name = unique_name()
    args = ["--nproc-per-node=1", "--module", "ddp_trainer", "--device=cpu", "--stepz=10"]
    doc = job(name, nodes=1, procsPerNode=1, maxRestarts=3, command=["torchrun"], args=args)
    code, out = run_local(tmp_path, [doc])
    assert code == 1, out
    assert "error: unrecognized arguments: --stepz=10" in out, out
    summary = out.split(f"{name}-1-0 exited 1; its first error")[1]
    assert "unrecognized arguments: --stepz=10" in summary and "Root Cause" not in summary, out
    assert "InvalidArguments" in out and "attempt 2" not in out, out


def test_a_missing_model_module_is_a_trainer_error_not_a_divergence(tmp_path: Path) -> None:
    name = unique_name()
    trainer = {"steps": 20, "model": "nosuchpkg.models:build"}
    code, out = run_local(tmp_path, [job(name, nodes=1, maxRestarts=0, trainer=trainer)])
    assert code == 1, out
    assert "DIVERGED" not in out and "sync: no verdict: the trainer failed (TrainerError" in out, out
    assert "nosuchpkg" in out


def test_a_repair_run_counts_its_repairs(tmp_path: Path) -> None:
    name = unique_name()
    doc = job(
        name,
        nodes=1,
        trainer={"steps": 40, "batchSize": 16, "checkpointEvery": 0},
        syncCheck={"everySteps": 10, "onDivergence": "Repair"},
        env=[{"name": "DDPJOB_CHAOS_DIVERGE", "value": "rank=1,step=15"}],
    )
    code, out = run_local(tmp_path, [doc])
    assert code == 0, out
    assert "1 repair(s) re-broadcast rank 0's model" in out and "verified bit-identical" not in out, out


def test_a_single_rank_says_its_check_proves_nothing(tmp_path: Path) -> None:
    name = unique_name()
    doc = job(name, nodes=1, procsPerNode=1, trainer={"steps": 20, "batchSize": 16, "checkpointEvery": 0})
    code, out = run_local(tmp_path, [doc])
    assert code == 0, out
    assert "sync: a single rank" in out and "prove nothing" in out, out


@pytest.mark.parametrize("rank", [1, 2])
def test_a_crash_in_a_users_script_is_blamed_on_the_rank_that_crashed(tmp_path: Path, rank: int) -> None:
    """2 × 2 ranks of a script with no ddpjob code; one rank raises at step 5 (rank 1: local rank 1 of node
    0, whose rank 0 writes the pod's report; rank 2: node 1's own rank 0). Its peers fail a moment later in
    their next collective. The summary names the rank that raised, with its own error, in the words of a
    user's command; the peers' collective errors come after it, as consequences."""
    name = unique_name()
    script = Path(__file__).resolve().parents[2] / "helpers" / "crash_on_rank.py"
    env = [{"name": "CRASH_RANK", "value": str(rank)}, {"name": "CRASH_STEP", "value": "5"}]
    doc = job(name, maxRestarts=0, command=["torchrun"], args=[str(script)], env=env)
    del doc["spec"]["trainer"]
    code, out = run_local(tmp_path, [doc])
    assert code == 1, out
    crash = f"RuntimeError: injected crash on rank {rank} at step 5"
    summary = next(line for line in out.splitlines() if line.startswith(f"ddpjob local: {name}: Failed"))
    assert f"attempt 1 failed (rank {rank} failed first, in your command: {crash}; then rank" in summary, out
    assert "failed as a consequence (RuntimeError: Connection closed by peer" in summary, out
    assert "TrainerError" not in summary, out
    assert f"sync: no verdict: your command failed on rank {rank} ({crash})" in out, out
