"""What a launcher reads of its own workers: the marks they leave beside its launch state
(:func:`ddp_trainer.core.inplace.mark_worker`; :class:`ddp_trainer.sync.SyncHealth` writes them, so the
built-in trainer and a user's script under it alike).

A worker's mark says that its group formed: every rank took part in a collective with it (``SyncHealth``'s
gather of restarts at its start), so a peer lost from then on fails a collective at once. Until then, a
member of the round whose process ended as the workers started leaves them waiting for its rank in the
workers' store until the group's timeout (30 minutes): :mod:`ddp_trainer.launch.silence` judges it lost
when this node's workers have not said that their group formed (:meth:`Marks.starting`).

Workers that leave no marks (a user's script without ``SyncHealth``) are never taken to be starting: the
launcher cannot tell them from workers that formed their group long ago.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ddp_trainer.core.inplace import WORKER_MARK_PREFIX


def pids(group: Any) -> list[int]:
    """The process ids of torch's worker ``group``'s workers (none before they started)."""
    return [int(worker.id) for worker in group.workers if isinstance(worker.id, int)]


class Marks:
    """The marks of this launcher's workers, in ``directory`` (the launch state's). ``builtin``: its
    workers are the built-in trainer, which always leaves them."""

    def __init__(self, directory: Path, builtin: bool = False) -> None:
        self.directory, self.builtin = directory, builtin
        self.reported = False
        """A worker of this launcher left a mark: its workers leave them (a user's script with
        ``SyncHealth``)."""
        self.formed: set[int] = set()
        """Workers of this round whose group formed (their marks were seen)."""

    def clear(self) -> None:
        """A new round: the last round's workers ended, and their marks go with them."""
        self.formed = set()
        for path in self.directory.glob(f"{WORKER_MARK_PREFIX}*"):
            with contextlib.suppress(OSError):
                path.unlink()

    def read(self, pid: int) -> str | None:
        """The worker ``pid``'s note, if it left one."""
        try:
            return (self.directory / f"{WORKER_MARK_PREFIX}{pid}").read_text()
        except OSError:
            return None

    def starting(self, pids: Iterable[int]) -> bool:
        """Workers ``pids`` that leave marks have not said yet that their group formed. A mark seen once
        makes the workers of later rounds expected to leave them too (a user's script with
        ``SyncHealth``)."""
        pids = list(pids)
        if not pids or self.formed.intersection(pids):
            return False
        for pid in pids:
            if self.read(pid) is not None:
                self.formed.add(pid)
                self.reported = True
                return False
        return self.builtin or self.reported
