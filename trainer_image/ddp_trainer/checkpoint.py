"""Checkpoints: atomic files that say who wrote them, only of verified states, restored identically on
every rank.

* Only global rank 0 writes, and only right after a sync check passed at that very step, so a
  checkpoint is never a diverged model; a divergence stops all saving until a check passes again.
* A file is a header line (the writing DDPJob's namespace, name and uid, the settings that shape the
  model and its digest, the step, and a sha256 over all of it) and the torch payload: see
  :mod:`ddp_trainer.provenance`.
* A save writes ``.step-XXXXXXXX.<job>.pt.tmp-<pid>``, fsyncs it and renames it to
  ``step-XXXXXXXX.<job>.pt`` (``<job>`` is the DDPJob's name; none outside a DDPJob), atomic on POSIX: a
  crash mid-save leaves the previous checkpoints untouched. Each step has its own file; a save at a step
  that already has one of this job's files replaces it in one rename. Then this
  job's files beyond the newest ``keep`` are removed, and so are this job's files of later steps (an
  earlier attempt's files that this attempt passed over as corrupt). Another job's files are never
  overwritten or removed.
* Restore: rank 0 reads the files newest first, verifies each, and :func:`provenance.choose` decides
  (resume, warm start, refuse, or start fresh); the decision and the payload's bytes are broadcast, so
  every rank loads the same bytes. Pods that see a different (or empty) checkpoint volume still end with
  the same model AND optimizer state, which the trainer then verifies before step 1.
"""

from __future__ import annotations

import io
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddp_trainer import provenance
from ddp_trainer.provenance import Candidate, Choice, Identity, Writer
from ddp_trainer.state import TrainState

log = logging.getLogger("ddp_trainer")

_NAME = re.compile(r"^step-(\d{8})(?:\.[^/]+)?\.pt$")
_PAYLOAD_KEYS = frozenset({"model", "optimizer", "scaler", "step", "epoch"})


class CheckpointRefused(Exception):
    """The volume holds another job's checkpoint, or this job's with other settings."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def checkpoint_path(directory: Path, step: int, job: str = "") -> Path:
    """The file of DDPJob ``job`` for ``step``: ``step-00001500.<job>.pt`` (``step-00001500.pt`` outside a
    DDPJob), so that jobs sharing a volume never write each other's files."""
    return directory / (f"step-{step:08d}.{job}.pt" if job else f"step-{step:08d}.pt")


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints in ``directory`` as ``(step, path)``, oldest first (temp files ignored)."""
    if not directory.is_dir():
        return []
    found = [(int(m[1]), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found, key=lambda found: (found[0], found[1].name))


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


def owner(path: Path) -> Identity | None:
    """Who the header of ``path`` names (unverified), or None when it has no readable header."""
    try:
        with open(path, "rb") as f:
            head = f.read(provenance.MAX_HEADER_BYTES + 1)
    except OSError:
        return None
    return provenance.peek_identity(head)


def save(directory: Path, state: TrainState, writer: Writer, keep: int) -> Path | None:
    """Rank 0 only: write the checkpoint of ``state.step`` and prune this job's old ones. Returns the
    file, or None when that step's file belongs to another job (never overwritten; the save is skipped)."""
    path = checkpoint_path(directory, state.step, writer.identity.name)
    theirs = owner(path) if path.exists() else None
    if theirs is not None and theirs != writer.identity:
        log.warning("step %d: not saving: %s belongs to %s", state.step, path, theirs)
        return None
    write_atomic(path, provenance.encode(writer, state.step, serialize(state)))
    prune(directory, writer.identity, state.step, keep)
    return path


def prune(directory: Path, identity: Identity, saved_step: int, keep: int) -> list[Path]:
    """Remove this job's files beyond the newest ``keep`` up to ``saved_step`` (which is always kept), and
    this job's files of later steps. Returns what was removed."""
    own = [(step, path) for step, path in list_checkpoints(directory) if owner(path) == identity]
    later = [path for step, path in own if step > saved_step]
    older = [path for step, path in own if step < saved_step]
    doomed = later + older[: max(0, len(older) - (keep - 1))]
    for path in doomed:
        path.unlink(missing_ok=True)
    return doomed


def scan(directory: Path) -> Iterator[Candidate]:
    """The checkpoint files, newest first, each read and verified (lazily: one file in memory at a time)."""
    for step, path in reversed(list_checkpoints(directory)):
        try:
            header, payload = provenance.decode(path.read_bytes())
        except (OSError, ValueError) as err:
            yield Candidate(path.name, step, problem=str(err))
            continue
        if header.step != step:
            yield Candidate(path.name, step, problem=f"the header says step {header.step}")
            continue
        yield Candidate(path.name, step, header, payload)


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


def restore_on_rank0(directory: Path | None, writer: Writer, warm_start_from: str) -> Choice:
    """Collective: rank 0 scans ``directory`` and chooses; every rank gets the same :class:`Choice`."""
    box: list[Any] = [Choice("fresh")]
    if dist.get_rank() == 0 and directory is not None:
        box[0] = provenance.choose(
            scan(directory), writer, warm_start_from=warm_start_from, where=str(directory), loadable=loadable
        )
        for skipped in box[0].skipped:
            log.warning("checkpoint skipped: %s", skipped)
    dist.broadcast_object_list(box, src=0)  # an opaque blob: the right tool here, unlike for parameters
    choice: Choice = box[0]
    return choice


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
