"""A checkpoint's torch payload, the bytes after its header (:mod:`ddp_trainer.checkpoint.provenance`): what
a save writes (:func:`serialize`: the model's, optimizer's and scaler's state, the step and the epoch),
whether torch can load a file's (:func:`loadable`, asked by :func:`provenance.choose
<ddp_trainer.checkpoint.provenance.choose>` before it chooses a file, and only then), and what a resume
and a warm start load (:func:`load_into`, :func:`load_weights`). The files and the store are
:mod:`ddp_trainer.checkpoint.checkpoints`'s.
"""

from __future__ import annotations

import io

import torch

from ddp_trainer.checkpoint.provenance import Candidate
from ddp_trainer.core.state import TrainState

_PAYLOAD_KEYS = frozenset({"model", "optimizer", "scaler", "step", "epoch"})


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    inner = getattr(model, "module", model)
    assert isinstance(inner, torch.nn.Module)
    return inner


def serialize(state: TrainState) -> bytes:
    """The torch payload: model, optimizer and scaler state, step and epoch."""
    buffer = io.BytesIO()
    torch.save(
        {
            "model": _unwrap(state.model).state_dict(),
            "optimizer": state.optimizer.state_dict(),
            "scaler": state.scaler.state_dict(),
            "step": state.step,
            "epoch": state.epoch,
        },
        buffer,
    )
    return buffer.getvalue()


def loadable(candidate: Candidate) -> str:
    """Why ``torch.load`` cannot use a candidate's payload (``""``: it can)."""
    assert candidate.payload is not None
    try:
        data = torch.load(io.BytesIO(candidate.payload), map_location="cpu", weights_only=True)
    except Exception as err:
        return f"torch.load failed: {type(err).__name__}: {err}"
    keys = set(data) if isinstance(data, dict) else set()
    if not keys >= _PAYLOAD_KEYS:
        return f"torch.load found no train state (missing {sorted(_PAYLOAD_KEYS - keys)})"
    return ""


def load_into(state: TrainState, payload: bytes, device: torch.device) -> None:
    """Resume: load a payload from :func:`serialize` into ``state`` (before DDP wrapping)."""
    data = torch.load(io.BytesIO(payload), map_location=device, weights_only=True)
    _unwrap(state.model).load_state_dict(data["model"])
    state.optimizer.load_state_dict(data["optimizer"])
    state.scaler.load_state_dict(data["scaler"])
    state.step, state.epoch = int(data["step"]), int(data["epoch"])


def load_weights(state: TrainState, payload: bytes, device: torch.device) -> None:
    """Warm start: only the model's weights; the optimizer, scaler, step and epoch stay fresh."""
    data = torch.load(io.BytesIO(payload), map_location=device, weights_only=True)
    _unwrap(state.model).load_state_dict(data["model"])
