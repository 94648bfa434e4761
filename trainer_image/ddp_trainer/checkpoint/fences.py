"""Fences: which world wrote a checkpoint, and whether the world that went on has passed it by. Pure (no
torch, no I/O): :mod:`ddp_trainer.checkpoint.checkpoints` reads and writes the fences in the store.

A *world* is one start of the trainer's processes against a checkpoint store: the first run of an attempt,
each gang restart in place, each elastic resize, each attempt. The store numbers them itself: before its
first step, rank 0 of a new world that restored step S (0: a fresh or warm start) publishes a fence,
``fence-<world, 8 digits>.<job>.json`` (``"world W started from step S"``), with W one more than the
highest fence of that job's name in the store, and stamps W on every checkpoint it writes. A world's
number does not depend on the launcher, its rendezvous rounds or a rendezvous store that restarted
empty; it holds for rigid jobs, attempts, ``ddpjob local`` and a plain torchrun alike. A world re-formed
in the same processes (a heal without a restart, :mod:`ddp_trainer.core.reform`) is a new world too: its
rank 0 must publish its fence (:func:`ddp_trainer.checkpoint.checkpoints.begin_world`) before its first
step.

The rule, decided at read time (:func:`stale`): a checkpoint written by world w at step s is *stale* when a
fence of the same job says that a later world W > w started from a step S < s. Such a checkpoint was
published after the world went on without its writer (a node that froze mid-write and woke), on a
trajectory the world that went on never took: no restore chooses it, and the next save of a newer world
removes it. A checkpoint without a world (written before fences existed) is world 0, older than any.

A fence carries the ``(world, step)`` of the job's earlier fences that still rule something out
(:func:`carried`), so the store keeps only the newest few fence objects and nothing is forgotten.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ddp_trainer.checkpoint.provenance import Header, Identity

FORMAT = "ddpjob-fence/1"
_NAME = re.compile(r"^fence-(\d{8})(?:\.([^/]+))?\.json$")
CARRIED_LIMIT = 4096
"""Earlier fences a fence carries at most (a fence of a job with more world starts than this forgets the
oldest, whose writers are long gone)."""


@dataclass(frozen=True)
class Fence:
    """World ``world`` of the DDPJob ``identity`` started from checkpoint step ``step``."""

    identity: Identity
    world: int
    step: int

    def __str__(self) -> str:
        return f"world {self.world} started from step {self.step}"


def fence_name(world: int, job: str = "") -> str:
    """The fence object of world ``world`` of DDPJob ``job``: ``fence-00000003.<job>.json``."""
    return f"fence-{world:08d}.{job}.json" if job else f"fence-{world:08d}.json"


def listed(names: Iterable[str], job: str) -> list[tuple[int, str]]:
    """The fences of DDPJob name ``job`` among a store's ``names`` (any uid) as ``(world, name)``, oldest
    first."""
    found = [(int(m[1]), name) for name in names if (m := _NAME.match(name)) and (m[2] or "") == job]
    return sorted(found)


def next_world(names: Iterable[str], job: str) -> int:
    """The number a new world of ``job`` takes: one more than the highest fence of its name (1: none)."""
    return max((world for world, _ in listed(names, job)), default=0) + 1


def stale(identity: Identity, world: int, step: int, fences: Iterable[Fence]) -> Fence | None:
    """The fence that rules out a checkpoint of ``identity`` written by world ``world`` at ``step``: a
    later world of the same job that started from an earlier step (the earliest such world); None when
    none does."""
    ruling = [f for f in fences if f.identity == identity and f.world > world and f.step < step]
    return min(ruling, key=lambda f: f.world, default=None)


def staleness(known: list[Fence]) -> Callable[[Header], str]:
    """:func:`provenance.choose <ddp_trainer.checkpoint.provenance.choose>`'s ``stale``: why one of this
    job's ``known`` fences rules a checkpoint out (:func:`stale`; ``""``: none does)."""

    def why(header: Header) -> str:
        ruling = stale(header.identity, header.world, header.step, known)
        if ruling is None:
            return ""
        return (
            f"written by world {header.world} after {ruling} (a stale world's late checkpoint: the job "
            "went on without it)"
        )

    return why


def carried(fences: Iterable[Fence], identity: Identity) -> list[Fence]:
    """The fences of ``identity`` a new fence must carry, oldest first: each world once (the lowest step
    said for it, the stricter), without those a later one makes redundant (a later world that started
    from the same or an earlier step rules out everything they do)."""
    lowest: dict[int, Fence] = {}
    for f in fences:
        if f.identity == identity and (f.world not in lowest or f.step < lowest[f.world].step):
            lowest[f.world] = f
    kept: list[Fence] = []
    floor: int | None = None
    for world in sorted(lowest, reverse=True):
        f = lowest[world]
        if floor is None or f.step < floor:
            kept.append(f)
            floor = f.step
    return list(reversed(kept))[-CARRIED_LIMIT:]


def encode(fence: Fence, earlier: Iterable[Fence] = ()) -> bytes:
    """A fence object's bytes: one line of JSON, with the earlier fences it carries."""
    ident = fence.identity
    fields = {
        "format": FORMAT,
        "job": {"namespace": ident.namespace, "name": ident.name, "uid": ident.uid},
        "world": fence.world,
        "step": fence.step,
        "earlier": [[f.world, f.step] for f in earlier if f.world < fence.world],
    }
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def decode(data: bytes) -> list[Fence]:
    """The fence in a fence object's bytes, then the earlier ones it carries; ``ValueError`` when it is
    not one."""
    try:
        fields = json.loads(data)
        if fields.get("format") != FORMAT:
            raise ValueError(f"format {fields.get('format')!r}, expected {FORMAT!r}")
        job = fields["job"]
        identity = Identity(str(job["namespace"]), str(job["name"]), str(job["uid"]))
        own = Fence(identity, int(fields["world"]), int(fields["step"]))
        return [own, *(Fence(identity, int(w), int(s)) for w, s in fields.get("earlier", ()))]
    except (KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"unreadable fence ({type(err).__name__}: {err})") from None
