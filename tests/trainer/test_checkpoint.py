"""Checkpoint files: atomic, pruned, restoring model and optimizer (:mod:`ddp_trainer.checkpoint`)."""

from __future__ import annotations

from pathlib import Path

import torch

from ddp_trainer import checkpoint
from ddp_trainer.loop import Precision
from ddp_trainer.model import MLP
from ddp_trainer.state import TrainState


def test_checkpoints_are_atomic_pruned_and_restore_model_and_optimizer(tmp_path: Path) -> None:
    (tmp_path / ".step-00000009.pt.tmp-1").write_bytes(b"partial")  # a crash mid-save
    (tmp_path / "notes.txt").write_text("ignored")
    model = MLP()
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 32)).sum().backward()
    optimizer.step()
    state = TrainState(model, optimizer, Precision.of(torch.device("cpu"), "fp32").scaler(), step=0, epoch=1)
    for step in (4, 8, 12):
        state.step = step
        checkpoint.save(tmp_path, state, {"world_size": 2})
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [8, 12]
    assert not list(tmp_path.glob(".step-*12*"))
    fresh = TrainState(MLP(), torch.optim.AdamW(MLP().parameters()), state.scaler)
    fresh.optimizer = torch.optim.AdamW(fresh.model.parameters())
    checkpoint.load_into(fresh, checkpoint.checkpoint_path(tmp_path, 12).read_bytes(), torch.device("cpu"))
    assert (fresh.step, fresh.epoch) == (12, 1)
    for a, b in zip(model.state_dict().values(), fresh.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    moments = [s["exp_avg"] for s in fresh.optimizer.state.values()]
    assert moments and all(
        torch.equal(x, y["exp_avg"]) for x, y in zip(moments, optimizer.state.values(), strict=True)
    )
