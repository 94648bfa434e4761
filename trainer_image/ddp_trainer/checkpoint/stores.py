"""Where checkpoints live: a folder (a volume) or a bucket prefix (object storage), behind one small
interface, so that :mod:`ddp_trainer.checkpoint.checkpoints` keeps every guarantee on both.

A store holds named blobs in one flat place. ``publish`` is atomic: a reader sees the whole blob under its
name or nothing (a folder: temp file, fsync, rename; object storage: one PUT, or a multipart upload
completed at the end, which S3 makes visible only whole). ``head`` reads the first bytes, for the header
that says who wrote a checkpoint. Errors the store cannot get past (credentials, a missing bucket) raise
:class:`StoreRefused` with a message that names the store and the cause.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol


class StoreRefused(Exception):
    """The store refused the trainer: wrong credentials, no such bucket, access denied. A configuration
    error: no restart can fix it."""


class Store(Protocol):
    where: str
    """The place, for messages: a folder's path or ``s3://bucket/prefix`` (never a credential)."""

    def names(self) -> list[str]:
        """The blobs' names (no order)."""
        ...

    def read(self, name: str) -> bytes: ...

    def head(self, name: str, size: int) -> bytes:
        """The first ``size`` bytes (fewer if the blob is shorter)."""
        ...

    def exists(self, name: str) -> bool: ...

    def publish(self, name: str, data: bytes) -> None:
        """Write ``data`` under ``name`` atomically: never a partial blob under that name."""
        ...

    def remove(self, name: str) -> None:
        """Remove ``name`` (gone already: fine)."""
        ...

    def location(self, name: str) -> str:
        """Where ``name`` is, for a log line."""
        ...


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


class DirectoryStore:
    """A folder: a volume every pod mounts (or a local folder)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.where = str(path)

    def names(self) -> list[str]:
        return [p.name for p in self.path.iterdir() if p.is_file()] if self.path.is_dir() else []

    def read(self, name: str) -> bytes:
        return (self.path / name).read_bytes()

    def head(self, name: str, size: int) -> bytes:
        with open(self.path / name, "rb") as f:
            return f.read(size)

    def exists(self, name: str) -> bool:
        return (self.path / name).exists()

    def publish(self, name: str, data: bytes) -> None:
        write_atomic(self.path / name, data)

    def remove(self, name: str) -> None:
        (self.path / name).unlink(missing_ok=True)

    def location(self, name: str) -> str:
        return str(self.path / name)
