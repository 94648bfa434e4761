"""The heal notice (issue 57): what a launcher tells its workers when their world changed and they may heal
in place instead of being restarted. The launcher runs the next rendezvous without stopping its workers and
writes the new world, as torch assigned it, to a file beside the launch state (:func:`notice_path`); a
worker that lost a peer and marked itself heal-wanted (:data:`HEAL_WANTED`, in its mark,
:func:`ddp_trainer.core.inplace.mark_worker`) reads it and re-forms its group there
(:mod:`ddp_trainer.sync.heal`). A file, not a store key: the launcher and its workers share the pod's
filesystem, as the launch state and the marks already do, and the workers need no rendezvous store.

Also the notes a worker leaves in its mark about a heal (:func:`healed_note`, :func:`heal_failed_note`,
:func:`read_note`), and the launcher's request that its workers sever their connections when a member of
their round went silent (:func:`request_sever`, :class:`SeverWatch`), and its request that they leave their
group together at the next step boundary when a node waits to join (:func:`request_grow`). Pure but for the
files' reads and atomic writes and the watch's thread; no torch: the launcher imports it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ddp_trainer import contract

NOTICE_FILE = "heal-notice.json"
"""The notice's name, in the launch state's folder."""
SEVER_FILE = "heal-sever"
"""The launcher's sever request's name, beside the notice (:func:`request_sever`)."""
GROW_FILE = "heal-grow"
"""The launcher's grow request's name, beside the notice (:func:`request_grow`)."""
HEAL_WANTED = "heal-wanted"
"""A worker's mark: a collective failed with a peer's loss; it waits for a notice (bounded) before it exits
as it did before heals."""
HEALED = "healed"
HEAL_FAILED = "heal-failed"
WORLD_ENV = ("RANK", "WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE")
"""The launcher's variables a healed worker sets anew in its own environment (with ``MASTER_ADDR`` and
``MASTER_PORT``), so later readers (``read_launch_env``, users' code) see the new world."""


@dataclass(frozen=True)
class Notice:
    """One new world, as the launcher's rendezvous left it (torch's rank assignment)."""

    round: int
    """The rendezvous round the world formed in: newer notices have higher rounds."""
    ranks: dict[int, int]
    """Local rank → global rank in the new world, for this launcher's workers."""
    world_size: int
    group_rank: int
    """This node's rank among the world's nodes."""
    group_world_size: int
    master_addr: str
    master_port: int
    """Where the new world's rank 0 hosts its store (as torch's ``env://`` start would)."""
    trigger: str = ""
    """What the launcher saw: a worker's heal-wanted mark, a member gone from the round, a node waiting."""
    at: float = 0.0
    """Unix time the trigger was seen (the heal's seconds count from it)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def rank_of(self, local_rank: int) -> int:
        """The global rank of local worker ``local_rank`` in the new world."""
        if local_rank not in self.ranks:
            raise ValueError(f"the notice of round {self.round} has no rank for local rank {local_rank}")
        return self.ranks[local_rank]

    def env(self, local_rank: int) -> dict[str, str]:
        """The launcher's variables local worker ``local_rank`` would have had, started in this world (those
        of :data:`WORLD_ENV` and the master's; one role, as the launcher runs)."""
        rank = str(self.rank_of(local_rank))
        size = str(self.world_size)
        return {
            "RANK": rank,
            "WORLD_SIZE": size,
            "GROUP_RANK": str(self.group_rank),
            "GROUP_WORLD_SIZE": str(self.group_world_size),
            "ROLE_RANK": rank,
            "ROLE_WORLD_SIZE": size,
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


def notice_path(env: Mapping[str, str]) -> Path | None:
    """Where this launcher's notice lies: beside the launch state (None without a launcher)."""
    state = env.get(contract.LAUNCH_STATE_ENV, "")
    return Path(state).with_name(NOTICE_FILE) if state else None


def encode(notice: Notice) -> str:
    data = asdict(notice)
    data["ranks"] = {str(k): v for k, v in notice.ranks.items()}
    return json.dumps(data, sort_keys=True)


def decode(text: str) -> Notice:
    """The notice in ``text``; ``ValueError`` when it is not one."""
    try:
        data = json.loads(text)
        return Notice(
            round=int(data["round"]),
            ranks={int(k): int(v) for k, v in data["ranks"].items()},
            world_size=int(data["world_size"]),
            group_rank=int(data["group_rank"]),
            group_world_size=int(data["group_world_size"]),
            master_addr=str(data["master_addr"]),
            master_port=int(data["master_port"]),
            trigger=str(data.get("trigger", "")),
            at=float(data.get("at", 0.0)),
            extra=dict(data.get("extra", {})),
        )
    except (KeyError, TypeError, AttributeError, ValueError) as err:
        raise ValueError(f"not a heal notice: {type(err).__name__}: {err}") from None


def write_notice(path: Path, notice: Notice) -> None:
    """Write ``notice`` at ``path`` atomically (a reader sees the old one or the new one, never half)."""
    _write_whole(path, encode(notice))


def _write_whole(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def read_notice(path: Path | None) -> Notice | None:
    """The notice at ``path``; None when there is none (or it cannot be read: a launcher writes it whole)."""
    if path is None:
        return None
    try:
        return decode(path.read_text())
    except (OSError, ValueError):
        return None


def request_sever(path: Path, round_: int) -> None:
    """Ask the workers beside the notice at ``path`` whose world formed in round ``round_`` (or later) to shut
    their connections down (:class:`SeverWatch`): a member of the round went silent (frozen, cut off), and a
    collective blocked on it never ends by itself (its sockets stay open; gloo's abort does not end it
    either), while one whose sockets are shut fails at once, as after a peer's loss, and the worker heals."""
    _write_whole(path.with_name(SEVER_FILE), f"{round_} {time.time():.6f}")


def request_grow(path: Path, round_: int) -> None:
    """Ask the workers beside the notice at ``path`` whose world formed in round ``round_`` (or earlier) to
    leave their group together at the next step boundary, the step done and nothing in flight, and heal (a
    node waits to join): their watch reads it there (:meth:`SeverWatch.grow_requested`) and they agree on it
    with the other ranks."""
    _write_whole(path.with_name(GROW_FILE), f"{round_} {time.time():.6f}")


def grow_round(path: Path | None) -> int | None:
    """The round of the grow request beside the notice at ``path``; None where there is none."""
    if path is None:
        return None
    try:
        return int(path.with_name(GROW_FILE).read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None


def clear_sever(path: Path) -> None:
    """Take the sever and grow requests beside the notice at ``path`` away (workers start afresh: they are
    not theirs)."""
    path.with_name(SEVER_FILE).unlink(missing_ok=True)
    path.with_name(GROW_FILE).unlink(missing_ok=True)


class SeverWatch:
    """A worker's daemon thread that reads the launcher's sever request beside the notice at ``path`` every
    ``poll`` seconds and calls ``sever()`` once for each new request of a round at or past ``current()`` (the
    round of the newest notice this worker's world is past). A request there when the watch begins counts:
    the launcher takes an earlier world's away before it starts workers afresh (:func:`clear_sever`), and
    one written before the worker's watch began (its group just formed) is this world's.

    It reads the grow request too (:meth:`grow_requested`), so that a step boundary asks memory, not the
    file system, whether its world grows."""

    def __init__(
        self, path: Path, sever: Callable[[], object], current: Callable[[], int], poll: float = 0.1
    ) -> None:
        self.path, self.sever, self.current, self.poll = path.with_name(SEVER_FILE), sever, current, poll
        self.seen: str | None = None
        self.severed = 0
        """Requests acted on."""
        self.grow_path, self.grow = path, grow_round(path)
        """The round of the launcher's grow request as last read (None: none)."""
        threading.Thread(target=self._run, name="ddpjob-sever-watch", daemon=True).start()

    def _read(self) -> str | None:
        try:
            return self.path.read_text()
        except OSError:
            return None

    def grow_requested(self) -> bool:
        """Whether the launcher asks this worker's world to grow at its next step boundary (read within
        ``poll`` seconds of the request)."""
        return self.grow is not None and self.grow >= self.current()

    def _run(self) -> None:
        while True:
            time.sleep(self.poll)
            self.grow = grow_round(self.grow_path)
            text = self._read()
            if text is None or text == self.seen:
                continue
            self.seen = text
            try:
                round_ = int(text.split()[0])
            except (IndexError, ValueError):
                continue
            if round_ >= self.current():
                self.severed += 1
                self.sever()


def healed_note(round_: int, report: Mapping[str, Any]) -> str:
    """A healed worker's mark: the round it healed into and what the heal cost (step, lost, bytes,
    seconds)."""
    return f"{HEALED} {round_} {json.dumps(dict(report), sort_keys=True)}"


def heal_failed_note(round_: int, why: str) -> str:
    """A worker's mark when its heal failed: the round, and why in one line."""
    return f"{HEAL_FAILED} {round_} {' '.join(why.split())}"


@dataclass(frozen=True)
class Note:
    """A heal note read back: its kind (:data:`HEALED`, :data:`HEAL_FAILED`, :data:`HEAL_WANTED`), the
    round (-1 for heal-wanted) and the rest (the report, or why)."""

    kind: str
    round: int = -1
    report: dict[str, Any] = field(default_factory=dict)
    why: str = ""


def read_note(note: str) -> Note | None:
    """The heal note in a worker's mark, or None when the mark says something else (``formed``)."""
    kind, _, rest = note.strip().partition(" ")
    if kind == HEAL_WANTED:
        return Note(HEAL_WANTED)
    if kind not in (HEALED, HEAL_FAILED):
        return None
    number, _, tail = rest.partition(" ")
    try:
        round_ = int(number)
        if kind == HEALED:
            return Note(HEALED, round_, dict(json.loads(tail)) if tail else {})
    except (ValueError, TypeError):
        return None
    return Note(HEAL_FAILED, round_, why=tail)
