"""The layout sharded.layout reads from a model's DTensor parameters, on parameters that answer the DTensor
API as FSDP2's do (the multi-process tests run real meshes: tests/integration/trainer/test_health.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from ddp_trainer.sync import sharded


def _placement(replicate: bool) -> Any:
    return SimpleNamespace(is_replicate=lambda: replicate)


def _model(shape: tuple[int, ...], replicated: tuple[bool, ...]) -> nn.Module:
    mesh = SimpleNamespace(
        mesh=torch.zeros(shape),
        get_coordinate=lambda: [0] * len(shape),
        get_group=lambda dim: None,
    )
    model = nn.Linear(2, 2)
    for param in model.parameters():
        param.device_mesh = mesh  # type: ignore[attr-defined]
        param.placements = [_placement(r) for r in replicated]  # type: ignore[attr-defined]
        param.to_local = lambda p=param: p  # type: ignore[attr-defined]
    return model


def test_a_replicate_dimension_of_one_rank_compares_nothing(single_rank: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(sharded.dist, "get_process_group_ranks", lambda group: [0, 1])
    hsdp = sharded.layout(_model((2, 2), (True, False)))
    assert hsdp is not None and hsdp.kind == "HSDP" and hsdp.shards == 2, hsdp
    single = sharded.layout(_model((1, 4), (True, False)))  # groups of one rank: nothing to compare
    assert single is not None and single.kind == "FSDP" and single.replicate_dim is None, single
    assert single.describe() == "FSDP over 4 ranks: nothing replicated"
    assert sharded.layout(nn.Linear(2, 2)) is None  # not sharded at all
