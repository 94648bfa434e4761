"""Checkpoints: atomic files, only of verified states, restored identically on every rank.

* Only global rank 0 writes, and only right after a sync check passed at that very step, so a
  checkpoint is never a diverged model; a divergence stops all saving until a check passes again.
* A save writes ``.step-XXXXXXXX.pt.tmp-<pid>``, fsyncs it and renames it to ``step-XXXXXXXX.pt``
  (atomic on POSIX): a crash mid-save leaves the previous checkpoints untouched. Each step has its own
  file, so a new attempt never overwrites an older good checkpoint; the newest ``KEEP`` are kept.
* Restore: rank 0 reads the newest checkpoint's *bytes* and broadcasts them; every rank loads the same
  bytes. Pods that see a different (or empty) checkpoint volume still end with the same model AND
  optimizer state, which the trainer then verifies before step 1.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddp_trainer.state import TrainState

KEEP = 2
_NAME = re.compile(r"^step-(\d{8})\.pt$")


def checkpoint_path(directory: Path, step: int) -> Path:
    """The file for ``step``."""
    return directory / f"step-{step:08d}.pt"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints in ``directory`` as ``(step, path)``, oldest first (temp files ignored)."""
    if not directory.is_dir():
        return []
    found = [(int(m[1]), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found)


def write_atomic(path: Path, payload: bytes) -> None:
    """Write ``payload`` to ``path`` via a temp file, fsync and rename; never a partial file at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # make the rename itself durable
    finally:
        os.close(fd)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    inner = getattr(model, "module", model)
    assert isinstance(inner, torch.nn.Module)
    return inner


def serialize(state: TrainState, extra: dict[str, Any]) -> bytes:
    """The checkpoint payload: model, optimizer and scaler state, step, epoch and ``extra``."""
    buffer = io.BytesIO()
    torch.save(
        {
            "model": _unwrap(state.model).state_dict(),
            "optimizer": state.optimizer.state_dict(),
            "scaler": state.scaler.state_dict(),
            "step": state.step,
            "epoch": state.epoch,
            "extra": extra,
        },
        buffer,
    )
    return buffer.getvalue()


def save(directory: Path, state: TrainState, extra: dict[str, Any]) -> Path:
    """Rank 0 only: write the checkpoint for ``state.step`` and prune old ones."""
    path = checkpoint_path(directory, state.step)
    write_atomic(path, serialize(state, extra))
    for _, old in list_checkpoints(directory)[:-KEEP]:
        old.unlink(missing_ok=True)
    return path


def read_latest_on_rank0(directory: Path | None) -> tuple[int, bytes | None]:
    """Collective: rank 0 reads the newest checkpoint; every rank gets ``(step, bytes)`` (``None``: none)."""
    box: list[Any] = [None]
    if dist.get_rank() == 0 and directory is not None:
        found = list_checkpoints(directory)
        if found:
            step, path = found[-1]
            box[0] = (step, path.read_bytes())
    dist.broadcast_object_list(box, src=0)  # an opaque blob: the right tool here, unlike for parameters
    return box[0] if box[0] is not None else (0, None)


def load_into(state: TrainState, payload: bytes, device: torch.device) -> dict[str, Any]:
    """Load a payload from :func:`serialize` into ``state`` (before DDP wrapping); returns ``extra``."""
    data = torch.load(io.BytesIO(payload), map_location=device, weights_only=True)
    _unwrap(state.model).load_state_dict(data["model"])
    state.optimizer.load_state_dict(data["optimizer"])
    state.scaler.load_state_dict(data["scaler"])
    state.step, state.epoch = int(data["step"]), int(data["epoch"])
    extra: dict[str, Any] = data.get("extra", {})
    return extra
