"""The machine ``ddpjob local`` runs on: free ports, visible GPUs, the run folder. The I/O that local mode's
pod processes need, kept apart from the pure ``processes``."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from ddp_operator.api import names
from ddp_operator.local.processes import LOCAL_ADDR
from ddp_trainer import contract


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOCAL_ADDR, 0))
        port: int = sock.getsockname()[1]
        return port


def visible_gpus() -> int:
    """GPUs torch can see here (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    count: int = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return count


def prepare_run_dir(run_dir: Path, *, fresh: bool) -> str | None:
    """Start clean after a run that succeeded, keeping that run's folder (its logs and checkpoints) beside,
    as ``<name>.earlier-N``, with or without --fresh (a finished run is never discarded); with --fresh,
    discard an earlier unfinished run's; otherwise keep the volumes so that an interrupted or failed run
    resumes from its checkpoint. Returns a note for the user, if any."""
    state = run_dir / "state"
    previous = state.read_text().strip() if state.is_file() else None
    if previous == "Succeeded":
        kept = set_aside(run_dir)
        return f"the earlier run Succeeded: its logs and checkpoints are kept in {kept}; this run starts anew"
    if fresh:
        shutil.rmtree(run_dir, ignore_errors=True)
        return None
    checkpoint = run_dir / "volumes" / names.CHECKPOINT_VOLUME
    if checkpoint.is_dir() and any(checkpoint.glob("step-*.pt")):  # not only fences
        return (
            f"resuming from the checkpoint an earlier {previous or 'unfinished'} run left in {checkpoint} "
            "(--fresh starts over)"
        )
    return None


EARLIER = ".earlier-"
"""A finished run's folder, set aside by the next run: ``<name>.earlier-1``, ``-2``, ... (a DDPJob's name
may hold dots, so the number counts on, never into another job's folder)."""


def set_aside(run_dir: Path) -> Path:
    """Move ``run_dir`` to the first free ``<name>.earlier-N`` beside it; returns where it went."""
    taken = [
        int(number)
        for entry in run_dir.parent.glob(run_dir.name + EARLIER + "*")
        if (number := entry.name.removeprefix(run_dir.name + EARLIER)).isdigit()
    ]
    kept = run_dir.with_name(f"{run_dir.name}{EARLIER}{max(taken, default=0) + 1}")
    run_dir.rename(kept)
    return kept


def write_state(run_dir: Path, result: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "state").write_text(result + "\n")


def next_attempt(run_dir: Path) -> int:
    """The first attempt of this run: after the attempts an earlier, unfinished run left (their logs stay),
    else the first."""
    numbers = [
        int(entry.name.removeprefix("attempt-"))
        for entry in (run_dir.iterdir() if run_dir.is_dir() else ())
        if entry.name.startswith("attempt-") and entry.name.removeprefix("attempt-").isdigit()
    ]
    return max(numbers, default=contract.FIRST_ATTEMPT - 1) + 1
