"""Checkpoints: atomic files (or objects) that say who wrote them, only of verified states, restored
identically on every rank. Where they live is a :class:`~ddp_trainer.checkpoint.stores.Store`: a folder on a
volume or a bucket prefix (:mod:`ddp_trainer.checkpoint.objectstore`); every guarantee below holds on both.

* Only global rank 0 writes, and only right after a sync check passed at that very step, so a
  checkpoint is never a diverged model; a divergence stops all saving until a check passes again.
* A file is a header line (the writing DDPJob's namespace, name and uid, the settings that shape the
  model and its digest, the step, and a sha256 over all of it: see
  :mod:`ddp_trainer.checkpoint.provenance`) and the torch payload (:mod:`ddp_trainer.checkpoint.payload`).
* A save writes ``.step-XXXXXXXX.<job>.pt.tmp-<pid>``, fsyncs it and renames it to ``step-XXXXXXXX.<job>.pt``
  (``<job>`` is the DDPJob's name; none outside a DDPJob), atomic on POSIX: a crash mid-save leaves the
  previous checkpoints untouched (object storage: one PUT, visible only whole). Each step has its own file; a
  save at a step that already has this world's file replaces it in one rename. Then this job's files
  beyond the newest ``keep`` are removed, and so are this job's files of later steps (an earlier world's
  files that this one passed over as corrupt) and an earlier world's file of the same step. Another job's
  files are never overwritten or removed.
* Restore: rank 0 reads the files newest first, verifies each, and :func:`provenance.choose` decides
  (resume, warm start, refuse, or start fresh; a file is passed over if one of this job's fences rules it
  out, :func:`fences.staleness`, or if torch cannot load it, :func:`payload.loadable`); the decision and
  the payload's bytes are broadcast, so every rank loads the same bytes. Pods that see a different (or
  empty) checkpoint volume still end with the same model AND optimizer state, which the trainer then
  verifies before step 1.
* Fences (:mod:`ddp_trainer.checkpoint.fences`): before its first step, rank 0 of each world publishes
  ``world W started from step S`` and stamps W on its checkpoints (``step-XXXXXXXX.<job>.w<W>.pt`` from
  world 2 on, so that two worlds never share a name). A checkpoint an older world published after a newer
  one started, at a step past where it started, is never restored, and a newer world's next save removes
  it. Whatever a stale world still does, it never replaces, nor prunes, a newer world's file: a save checks
  the fences first (and does not publish past a newer one), and the pruning skips newer worlds' files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ddp_trainer import contract
from ddp_trainer.checkpoint import fences, payload, provenance
from ddp_trainer.checkpoint.fences import Fence
from ddp_trainer.checkpoint.provenance import Candidate, Choice, Identity, Writer
from ddp_trainer.checkpoint.stores import DirectoryStore, Store, StoreRefused
from ddp_trainer.checkpoint.stores import write_atomic as write_atomic
from ddp_trainer.core.state import TrainState

log = logging.getLogger("ddp_trainer")

_NAME = re.compile(r"^step-(\d{8})(?:\.[^/]+)?\.pt$")
_WORLD = re.compile(r"\.w(\d+)\.pt$")
FENCES_KEPT = 4
"""This job's newest fence objects kept (each carries the earlier ones that still rule something out)."""


class CheckpointRefused(Exception):
    """The store holds another job's checkpoint, or this job's with other settings, or refused the trainer."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


Where = Store | Path


def _store(where: Where) -> Store:
    return DirectoryStore(where) if isinstance(where, Path) else where


def open_store(where: str | Path) -> Store:
    """The store of ``--checkpoint-dir``: ``s3://bucket/prefix`` is object storage (its client imported
    only then: the ``s3`` extra), anything else a folder."""
    text = str(where)
    if text.startswith(contract.S3_SCHEME):
        from ddp_trainer.checkpoint.objectstore import S3Store

        return S3Store.from_url(text, os.environ)
    return DirectoryStore(Path(text))


def checkpoint_name(step: int, job: str = "", world: int = 0) -> str:
    """The name of DDPJob ``job``'s checkpoint for ``step``: ``step-00001500.<job>.pt``
    (``step-00001500.pt`` outside a DDPJob), so that jobs sharing a store never write each other's; from
    world 2 on, with the world: ``step-00001500.<job>.w2.pt``, so that worlds never write each other's."""
    stem = f"step-{step:08d}.{job}" if job else f"step-{step:08d}"
    return f"{stem}.w{world}.pt" if world > 1 else f"{stem}.pt"


def checkpoint_path(directory: Path, step: int, job: str = "", world: int = 0) -> Path:
    """The file of DDPJob ``job`` for ``step`` in a folder."""
    return directory / checkpoint_name(step, job, world)


def _world_in(name: str) -> int:
    return int(m[1]) if (m := _WORLD.search(name)) else 0


def list_checkpoints(where: Where) -> list[tuple[int, str]]:
    """Complete checkpoints in ``where`` as ``(step, name)``, oldest first (of one step, the older world's
    first; temp files ignored)."""
    found = [(int(m[1]), name) for name in _store(where).names() if (m := _NAME.match(name))]
    return sorted(found, key=lambda found: (found[0], _world_in(found[1]), found[1]))


def written_by(store: Store, name: str) -> tuple[Identity | None, int]:
    """Who the header of ``name`` names and its world (unverified); None when it has no readable header."""
    try:
        head = store.head(name, provenance.MAX_HEADER_BYTES + 1)
    except OSError:
        return None, 0
    return provenance.peek_identity(head), provenance.peek_world(head)


def owner(store: Store, name: str) -> Identity | None:
    """Who the header of ``name`` names (unverified), or None when it has no readable header."""
    return written_by(store, name)[0]


def read_fences(where: Where, identity: Identity, names: list[str] | None = None) -> list[Fence]:
    """The fences of DDPJob ``identity`` in ``where`` (its newest fence objects, each with the earlier
    fences it carries); an unreadable one is passed over (it only makes the rule less strict)."""
    store = _store(where)
    found: list[Fence] = []
    listed = fences.listed(store.names() if names is None else names, identity.name)
    for _, name in listed[-2 * FENCES_KEPT :]:
        try:
            found += fences.decode(store.read(name))
        except (OSError, ValueError) as err:
            log.warning("fence %s passed over: %s", store.location(name), err)
    return [f for f in found if f.identity == identity]


def begin_world(where: Where, writer: Writer, step: int, known: list[Fence]) -> int:
    """Rank 0 of a new world, before its first step (``step``: where it starts, 0 for a fresh or warm
    start; ``known``: :func:`read_fences`): publish the fence ``world W started from step`` and return W,
    the number this world stamps on its checkpoints. Then remove this job's fence objects beyond the newest
    :data:`FENCES_KEPT` (the new one carries what they said). Never touches a checkpoint."""
    store = _store(where)
    job = writer.identity.name
    world = fences.next_world(store.names(), job)
    fence = Fence(writer.identity, world, step)
    store.publish(fences.fence_name(world, job), fences.encode(fence, fences.carried(known, writer.identity)))
    mine = [name for w, name in fences.listed(store.names(), job) if w < world]
    for name in mine[: max(0, len(mine) - (FENCES_KEPT - 1))]:
        if _fence_owner(store, name) == writer.identity:
            store.remove(name)
    return world


def _fence_owner(store: Store, name: str) -> Identity | None:
    try:
        return fences.decode(store.read(name))[0].identity
    except (OSError, ValueError):
        return None


def save(where: Where, state: TrainState, writer: Writer, keep: int) -> str | None:
    """Rank 0 only: publish the checkpoint of ``state.step`` and prune this job's old ones. Returns where
    it went, or None when that step's checkpoint belongs to another job (never overwritten; no save), or
    when a newer world of this job started from an earlier step (this world is stale: it went on without
    it)."""
    store = _store(where)
    names = store.names()
    known: list[Fence] = []
    if any(w > writer.world for w, _ in fences.listed(names, writer.identity.name)):  # cheap: one listing
        known = read_fences(store, writer.identity, names)
        if ruling := fences.stale(writer.identity, writer.world, state.step, known):
            log.warning("step %d: not saving: this world (%d) is stale: %s", state.step, writer.world, ruling)
            return None
    name = checkpoint_name(state.step, writer.identity.name, writer.world)
    theirs = owner(store, name) if name in names else None
    if theirs is not None and theirs != writer.identity:
        log.warning("step %d: not saving: %s belongs to %s", state.step, store.location(name), theirs)
        return None
    store.publish(name, provenance.encode(writer, state.step, payload.serialize(state)))
    prune(store, writer.identity, state.step, keep, world=writer.world, saved=name)
    return store.location(name)


def prune(
    where: Where, identity: Identity, saved_step: int, keep: int, *, world: int = 0, saved: str = ""
) -> list[str]:
    """Remove this job's checkpoints beyond the newest ``keep`` up to ``saved_step`` (the file ``saved``
    is always kept), this job's of later steps, of the same step by an older world, and stale ones (a
    fence rules them out). Only files of world ``world`` and older: a newer world's are never touched. A
    world that a newer one outlived (its writer woke late) removes only stale files: the file the newer
    world started from is never among them. Returns the names removed."""
    store = _store(where)
    known = read_fences(store, identity)
    outlived = any(f.world > world for f in known)
    own: list[tuple[int, str]] = []
    doomed: list[str] = []
    for step, name in list_checkpoints(store):
        who, written = written_by(store, name)
        if who != identity or written > world or name == saved:
            continue
        if fences.stale(identity, written, step, known):
            doomed.append(name)
        elif outlived:
            continue
        elif step >= saved_step:
            doomed.append(name)
        else:
            own.append((step, name))
    doomed += [name for _, name in own[: max(0, len(own) - (keep - 1))]]
    for name in doomed:
        store.remove(name)
    return doomed


def scan(where: Where) -> Iterator[Candidate]:
    """The checkpoints, newest first, each read and verified (lazily: one in memory at a time)."""
    store = _store(where)
    for step, name in reversed(list_checkpoints(store)):
        try:
            header, body = provenance.decode(store.read(name))
        except (OSError, ValueError) as err:
            yield Candidate(name, step, problem=str(err))
            continue
        if header.step != step:
            yield Candidate(name, step, problem=f"the header says step {header.step}")
            continue
        yield Candidate(name, step, header, body)


def choose_on_rank0(where: Where, writer: Writer, warm_start_from: str) -> Choice:
    """Rank 0's choice among the checkpoints in ``where`` (a stale world's passed over), and unless it
    refuses, this world's fence published (:func:`begin_world`: the choice's ``world``); a store that
    refuses the trainer (credentials, a missing bucket) is a refusal too, so that every rank stops before
    step 1 and no restart follows."""
    store = _store(where)
    try:
        known = read_fences(store, writer.identity)
        choice = provenance.choose(
            scan(store),
            writer,
            warm_start_from=warm_start_from,
            where=store.where,
            loadable=payload.loadable,
            stale=fences.staleness(known),
        )
        if choice.action == "refuse":
            return choice
        started = choice.step if choice.action == "resume" else 0
        return dataclasses.replace(choice, world=begin_world(store, writer, started, known))
    except StoreRefused as err:
        message = f"the checkpoint storage refused the trainer: {err}"
        return Choice("refuse", reason=contract.CHECKPOINT_STORAGE_REFUSED, message=message)


def restore_on_rank0(where: Where | None, writer: Writer, warm_start_from: str) -> Choice:
    """Collective: rank 0 scans ``where``, chooses and fences; every rank gets the same :class:`Choice`.

    A refusal ends every rank, and a rank's end makes its launcher SIGTERM the pod's other ranks: one of
    those still receiving the choice failed rank 0's broadcast ("Connection closed by peer"), whose report
    then hid the refusal (seen twice in one full run, under load). So on a refusal every rank meets the
    others in a barrier first: none can leave it before all entered it, that is before all hold the choice.
    The barrier's own failure (a rank ended first) changes nothing: every rank holds the refusal."""
    box: list[Any] = [Choice("fresh")]
    if dist.get_rank() == 0 and where is not None:
        box[0] = choose_on_rank0(where, writer, warm_start_from)
        for skipped in box[0].skipped:
            log.warning("checkpoint skipped: %s", skipped)
    dist.broadcast_object_list(box, src=0)  # an opaque blob: the right tool here, unlike for parameters
    choice: Choice = box[0]
    if choice.action == "refuse":
        with contextlib.suppress(RuntimeError):
            dist.barrier()
    return choice
