"""Checkpoints between jobs, through torchrun (1 "node" x 2 processes, gloo): job A trains and checkpoints;
job B in the same folder is refused before step 1 unless it asks for a warm start; a corrupted newest
checkpoint is skipped and the one before resumed; a stale world's late checkpoint is never resumed."""

from __future__ import annotations

import io
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import ddp_operator.decide.checkpoints
from ddp_trainer import contract
from ddp_trainer.checkpoint import checkpoints as checkpoints_io
from ddp_trainer.checkpoint import provenance
from helpers.torchrun_helpers import Launch, checkpoints, launch

pytestmark = pytest.mark.slow

TRAINER = ["--module", "ddp_trainer", "--device=cpu", "--backend=gloo", "--seed=7", "--batch-size=16"]
TRAINER += ["--steps=20", "--sync-every=10", "--checkpoint-every=10", "--timeout-seconds=120"]
WORKTREE = Path(__file__).resolve().parents[3] / "trainer_image" / "ddp_trainer"


@dataclass
class JobA:
    folder: Path
    report: dict[str, Any]


def _run(work: Path, folder: Path, name: str, *extra: str) -> tuple[list[int], Launch]:
    env = {"DDPJOB_NAME": name, "DDPJOB_UID": f"uid-{name}"}
    run = launch(work, [*TRAINER, f"--checkpoint-dir={folder}", *extra], nnodes=1, env=env)
    return run.wait(), run


def _payload(path: Path) -> dict[str, Any]:
    _, payload = provenance.decode(path.read_bytes())
    data: dict[str, Any] = torch.load(io.BytesIO(payload), weights_only=True)
    return data


@pytest.fixture(scope="module")
def job_a(tmp_path_factory: pytest.TempPathFactory) -> JobA:
    work = tmp_path_factory.mktemp("job-a")
    codes, run = _run(work, work / "ckpt", "a")
    assert codes == [0], run.logs()
    assert checkpoints(work / "ckpt") == ["step-00000010.a.pt", "step-00000020.a.pt"]
    return JobA(work / "ckpt", run.report())


def _copy(job_a: JobA, tmp_path: Path) -> Path:
    return Path(shutil.copytree(job_a.folder, tmp_path / "ckpt"))


def test_the_trainer_under_test_is_this_worktrees(job_a: JobA) -> None:
    import ddp_trainer

    assert Path(ddp_trainer.__file__).resolve().parent == WORKTREE  # here, and in torchrun's workers:
    assert job_a.report["result"] == contract.SUCCEEDED  # their files are named and headed as this code does
    header, _ = provenance.decode((job_a.folder / "step-00000020.a.pt").read_bytes())
    assert (header.identity, header.step) == (provenance.Identity("testns", "a", "uid-a"), 20)


def test_another_job_is_refused_before_step_1_and_never_restarted(job_a: JobA, tmp_path: Path) -> None:
    folder = _copy(job_a, tmp_path)
    codes, run = _run(tmp_path, folder, "b")
    assert codes == [1], run.logs()  # torchrun collapses the ranks' 78 into 1 ...
    assert f"exitcode  : {contract.CHECKPOINT_REFUSED_EXIT_CODE}" in run.logs()  # ... and lists it per rank
    report = run.report()
    assert (report["result"], report["reason"]) == (contract.FAILED, contract.FOREIGN_CHECKPOINT)
    assert (report["step"], report["checks"], report["resumedFromStep"]) == (0, 0, 0)
    assert report["message"] == (
        f"checkpoint step-00000020.a.pt in {folder} was written by DDPJob testns/a (uid uid-a) at step 20; "
        "this is DDPJob testns/b (uid uid-b): refusing to resume another job's checkpoint (set "
        "spec.checkpoint.warmStartFrom: a (--warm-start-from=a) to start from its weights, or give this job "
        "its own checkpoint volume)"
    )
    assert checkpoints(folder) == ["step-00000010.a.pt", "step-00000020.a.pt"]  # nothing written


def test_the_same_job_with_other_settings_is_refused_naming_the_setting(job_a: JobA, tmp_path: Path) -> None:
    codes, run = _run(tmp_path, _copy(job_a, tmp_path), "a", "--batch-size=8", "--steps=30")
    assert codes == [1] and f"exitcode  : {contract.CHECKPOINT_REFUSED_EXIT_CODE}" in run.logs(), run.logs()
    report = run.report()
    assert (report["result"], report["reason"], report["step"]) == (contract.FAILED, "SettingsChanged", 0)
    assert "with other settings: batch_size: 16 in the checkpoint, 8 now; refusing" in report["message"]


def test_a_warm_start_takes_the_other_jobs_weights_only_and_starts_at_step_0(
    job_a: JobA, tmp_path: Path
) -> None:
    folder = _copy(job_a, tmp_path)
    # A learning rate too small to move any weight: B's parameters at its step 10 are A's at step 20.
    codes, run = _run(tmp_path, folder, "b", "--warm-start-from=a", "--learning-rate=1e-30")
    assert codes == [0], run.logs()
    report = run.report()
    assert (report["result"], report["warmStartedFrom"], report["resumedFromStep"]) == (
        contract.SUCCEEDED,
        "testns/a",
        0,
    )
    assert (report["step"], report["checks"], report["verified"]) == (20, 3, True)  # initial, 10, 20
    assert "skippedCheckpoints" not in report
    assert "warm start: the model weights of testns/a's step-00000020.a.pt (step 20)" in run.logs()
    assert checkpoints(folder) == [
        "step-00000010.a.pt",
        "step-00000010.b.pt",
        "step-00000020.a.pt",
        "step-00000020.b.pt",
    ]
    theirs, mine = _payload(folder / "step-00000020.a.pt"), _payload(folder / "step-00000010.b.pt")
    weights = [k for k in theirs["model"] if not k.endswith(("running_mean", "running_var", "_tracked"))]
    assert weights and all(torch.equal(theirs["model"][k], mine["model"][k]) for k in weights)
    steps = {int(s["step"]) for s in mine["optimizer"]["state"].values()}
    assert steps == {10}  # a fresh optimizer: A's had taken 20 steps
    # Restarted, B resumes its own checkpoint: its own always win over the warm start.
    codes, run = _run(tmp_path / "again", folder, "b", "--warm-start-from=a", "--learning-rate=1e-30")
    assert codes == [0], run.logs()
    again = run.report()
    assert (again["resumedFromStep"], again.get("warmStartedFrom"), again["step"]) == (20, None, 20)


def test_a_corrupt_newest_checkpoint_is_skipped_and_the_one_before_resumed(
    job_a: JobA, tmp_path: Path
) -> None:
    folder = _copy(job_a, tmp_path)
    newest = folder / "step-00000020.a.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit
    newest.write_bytes(bytes(data))
    codes, run = _run(tmp_path, folder, "a", "--steps=30")
    assert codes == [0], run.logs()
    report = run.report()
    assert (report["result"], report["resumedFromStep"], report["step"]) == (contract.SUCCEEDED, 10, 30)
    (skipped,) = report["skippedCheckpoints"]
    assert skipped.startswith("step-00000020.a.pt: contents do not match their sha256")
    assert f"checkpoint skipped: {skipped}" in run.logs()
    assert ddp_operator.decide.checkpoints.from_report(report)["skipped"] == [skipped]
    # The corrupt file was replaced by this run's own step 20 (its second world's: .w2), and keep=2 left
    # 20 and 30.
    assert checkpoints(folder) == ["step-00000020.a.w2.pt", "step-00000030.a.w2.pt"]
    provenance.decode((folder / "step-00000020.a.w2.pt").read_bytes())


def _relabelled(folder: Path, step: int, world: int) -> str:
    """A's step-20 state as world ``world``'s checkpoint of ``step``, published straight into the folder:
    what a stale world's rank 0 does when its frozen node wakes, after its own check."""
    header, payload = provenance.decode((folder / "step-00000020.a.pt").read_bytes())
    data = torch.load(io.BytesIO(payload), weights_only=True)
    data["step"] = step
    buffer = io.BytesIO()
    torch.save(data, buffer)
    writer = provenance.Writer(header.identity, header.settings, header.attempt, world=world)
    name = checkpoints_io.checkpoint_name(step, "a", world)
    (folder / name).write_bytes(provenance.encode(writer, step, buffer.getvalue()))
    return name


def test_a_stale_worlds_late_checkpoint_is_never_resumed_and_the_next_save_removes_it(
    job_a: JobA, tmp_path: Path
) -> None:
    """Job A's world 1 wrote steps 10 and 20; world 2 resumed 20 (its fence) and saved 30. Then world 1's
    stale rank 0 publishes 30 and 40 late: the trainer's world 3 (2 processes) resumes world 2's 30, says
    why it passed over 40, and its save at 40 removes both late files."""
    folder = _copy(job_a, tmp_path)
    header, _ = provenance.decode((folder / "step-00000020.a.pt").read_bytes())
    a = provenance.Writer(header.identity, header.settings, header.attempt)
    assert checkpoints_io.choose_on_rank0(folder, a, "").world == 2  # world 2 resumed step 20
    _relabelled(folder, 30, world=2)
    late = [_relabelled(folder, 30, world=1), _relabelled(folder, 40, world=1)]
    codes, run = _run(tmp_path, folder, "a", "--steps=40")
    assert codes == [0], run.logs()
    report = run.report()
    assert (report["result"], report["resumedFromStep"], report["step"]) == (contract.SUCCEEDED, 30, 40)
    assert report["skippedCheckpoints"] == [
        f"{late[1]}: written by world 1 after world 2 started from step 20 (a stale world's late "
        "checkpoint: the job went on without it)"
    ]
    assert checkpoints(folder) == ["step-00000030.a.w2.pt", "step-00000040.a.w3.pt"]
    assert sorted(p.name for p in folder.glob("fence-*")) == [f"fence-0000000{w}.a.json" for w in (1, 2, 3)]
