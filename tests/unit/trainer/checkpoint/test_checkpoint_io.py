"""Checkpoint files (:mod:`ddp_trainer.checkpoint.checkpoints`): atomic, stamped with their writer, verified
when read,
pruned without ever losing the newest good one, restoring model and optimizer (or only the weights)."""

from __future__ import annotations

from pathlib import Path

import torch

from ddp_trainer import contract
from ddp_trainer.checkpoint import checkpoints, payload, provenance
from ddp_trainer.checkpoint.provenance import Identity, Writer
from ddp_trainer.core.state import TrainState
from ddp_trainer.train.loop import Precision
from ddp_trainer.train.model import MLP
from helpers.trained import ME, OTHER, SETTINGS, trained_state


def _fresh_state() -> TrainState:
    model = MLP()
    return TrainState(
        model, torch.optim.AdamW(model.parameters()), Precision.of(torch.device("cpu"), "fp32").scaler()
    )


def _save_steps(directory: Path, steps: list[int], writer: Writer = ME, keep: int = 100) -> TrainState:
    state = trained_state()
    for step in steps:
        state.step = step
        assert checkpoints.save(directory, state, writer, keep) is not None
    return state


def _choose(directory: Path, **kwargs: str) -> provenance.Choice:
    return provenance.choose(checkpoints.scan(directory), ME, loadable=payload.loadable, **kwargs)


def _steps(directory: Path) -> list[int]:
    return [step for step, _ in checkpoints.list_checkpoints(directory)]


def test_a_checkpoint_records_its_writer_and_restores_model_and_optimizer(tmp_path: Path) -> None:
    (tmp_path / ".step-00000009.mine.pt.tmp-1").write_bytes(b"partial")  # a crash mid-save
    (tmp_path / "notes.txt").write_text("ignored")
    state = _save_steps(tmp_path, [12])
    assert not list(tmp_path.glob(".step-*12*"))
    header, _ = provenance.decode(checkpoints.checkpoint_path(tmp_path, 12, "mine").read_bytes())
    assert (header.identity, header.step, header.settings) == (ME.identity, 12, SETTINGS)
    choice = _choose(tmp_path)
    assert (choice.action, choice.step, choice.skipped) == ("resume", 12, ())
    fresh = _fresh_state()
    assert choice.payload is not None
    payload.load_into(fresh, choice.payload, torch.device("cpu"))
    assert (fresh.step, fresh.epoch) == (12, 1)
    for a, b in zip(state.model.state_dict().values(), fresh.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    moments = [s["exp_avg"] for s in fresh.optimizer.state.values()]
    assert moments and all(
        torch.equal(x, y["exp_avg"]) for x, y in zip(moments, state.optimizer.state.values(), strict=True)
    )


def test_truncated_bit_flipped_and_unloadable_files_are_skipped_newest_first(tmp_path: Path) -> None:
    _save_steps(tmp_path, [10, 20, 30, 40, 50])
    path = {step: checkpoints.checkpoint_path(tmp_path, step, "mine") for step in (20, 30, 40, 50)}
    path[50].write_bytes(path[50].read_bytes()[:-100])  # truncated
    data = bytearray(path[40].read_bytes())
    data[-10] ^= 0x04  # one flipped bit in the payload
    path[40].write_bytes(bytes(data))
    path[30].write_bytes(b"\x80\x02 a torch.save file from an older trainer")
    checkpoints.write_atomic(path[20], provenance.encode(ME, 20, b"not a torch payload"))  # digest fine
    choice = _choose(tmp_path)
    assert (choice.action, choice.step) == ("resume", 10)
    why = dict(s.split(": ", 1) for s in choice.skipped)
    assert list(why) == [f"step-000000{s}.mine.pt" for s in (50, 40, 30, 20)]
    assert why["step-00000050.mine.pt"].startswith("truncated: ")
    assert why["step-00000040.mine.pt"].startswith("contents do not match their sha256")
    assert why["step-00000030.mine.pt"].startswith("no checkpoint header")
    assert why["step-00000020.mine.pt"].startswith("torch.load failed")


def test_a_renamed_file_is_caught_by_its_header(tmp_path: Path) -> None:
    _save_steps(tmp_path, [10, 20])
    checkpoints.checkpoint_path(tmp_path, 20, "mine").rename(
        checkpoints.checkpoint_path(tmp_path, 90, "mine")
    )
    choice = _choose(tmp_path)
    assert (choice.action, choice.step) == ("resume", 10)
    assert choice.skipped == ("step-00000090.mine.pt: the header says step 20",)


def test_another_jobs_folder_is_refused_and_warm_start_loads_weights_only(tmp_path: Path) -> None:
    theirs = _save_steps(tmp_path, [1500], writer=OTHER)
    choice = _choose(tmp_path, where=str(tmp_path))
    assert (choice.action, choice.reason) == ("refuse", contract.FOREIGN_CHECKPOINT)
    assert "DDPJob team/other (uid u2)" in choice.message and "DDPJob team/mine (uid u1)" in choice.message
    choice = _choose(tmp_path, warm_start_from="other")
    assert (choice.action, choice.step, choice.warm_from) == ("warm", 1500, "team/other")
    fresh = _fresh_state()
    assert choice.payload is not None
    payload.load_weights(fresh, choice.payload, torch.device("cpu"))
    assert (fresh.step, fresh.epoch, fresh.optimizer.state_dict()["state"]) == (0, 0, {})
    for a, b in zip(theirs.model.state_dict().values(), fresh.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_keep_prunes_only_this_jobs_files_and_never_the_newest(tmp_path: Path) -> None:
    _save_steps(tmp_path, [5, 25], writer=OTHER)
    _save_steps(tmp_path, [10, 20, 30], keep=2)
    assert _steps(tmp_path) == [5, 20, 25, 30]  # the other job's files are never removed
    _save_steps(tmp_path, [40], keep=1)
    assert _steps(tmp_path) == [5, 25, 40]
    _save_steps(tmp_path, [50], keep=2)
    path50 = checkpoints.checkpoint_path(tmp_path, 50, "mine")
    path50.write_bytes(path50.read_bytes()[:-1])  # this job's newest, truncated
    assert _choose(tmp_path).step == 40
    # The restarted attempt resumes from 40 and saves 45 (keep=1): the earlier attempt's later file goes,
    # and the new file stays; saving the same step again replaces it in one rename.
    _save_steps(tmp_path, [45, 45], keep=1)
    assert _steps(tmp_path) == [5, 25, 45]
    assert _choose(tmp_path).step == 45


def test_jobs_sharing_a_folder_never_write_each_others_files(tmp_path: Path) -> None:
    _save_steps(tmp_path, [10], writer=OTHER)
    _save_steps(tmp_path, [10], writer=ME)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000010.mine.pt", "step-00000010.other.pt"]
    # A DDPJob deleted and created again has the old one's name but not its uid: its files stay the old one's.
    recreated = Writer(Identity("team", "mine", "u3"), SETTINGS)
    before = checkpoints.checkpoint_path(tmp_path, 10, "mine").read_bytes()
    state = trained_state(step=10)
    assert checkpoints.save(tmp_path, state, recreated, keep=2) is None
    assert checkpoints.checkpoint_path(tmp_path, 10, "mine").read_bytes() == before
    state.step = 20
    assert checkpoints.save(tmp_path, state, recreated, keep=1) == str(
        checkpoints.checkpoint_path(tmp_path, 20, "mine")
    )
    assert _steps(tmp_path) == [10, 10, 20]
    assert checkpoints.checkpoint_path(tmp_path, 20).name == "step-00000020.pt"  # outside any DDPJob
