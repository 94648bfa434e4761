"""What a launcher reads of its own workers: the marks they leave beside its launch state
(:func:`ddp_trainer.core.inplace.mark_worker`; :class:`ddp_trainer.sync.SyncHealth` writes them, so the
built-in trainer and a user's script under it alike), and the stop of workers that can no longer reach a
step boundary (:func:`stop_promptly`).

A worker's mark says, by its note and when it was written: its group formed (every rank took part in a
collective with it: a peer lost from then on fails a collective at once), a step boundary passed (the
step's seconds, renewed at most once a second), the world agreed to stop at this boundary, or rank 0 writes
a checkpoint. The launcher asks two things of them:

1. **Did this node's workers form their group?** Until they did, a member of the round that left (its
   process ended) leaves them waiting for its rank in the workers' store until the group's timeout (30
   minutes): :mod:`ddp_trainer.launch.silence` then judges it lost.
2. **Can they still reach a step boundary?** A pod stopped (the kubelet's SIGTERM: deleted, evicted, its
   gang restarted) has its workers stop at the next step boundary, rank 0 saving a checkpoint there; torch's
   agent waits 30 s for them, the pod's whole grace period. Workers that wait in a collective with a peer
   cut off or silent never reach one, so the launcher gives them a short bound (:func:`after_signal`) and
   stops them (SIGKILL) when no mark says they passed a step boundary, agreed to stop or write a checkpoint
   since the signal.

Workers that leave no marks (a user's script without ``SyncHealth``) are left to torch's ways: the launcher
cannot tell them apart from workers that save a checkpoint of their own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from ddp_trainer import contract
from ddp_trainer.core.inplace import FORMED, SAVING, STOPPING, WORKER_MARK_PREFIX

STOP_BOUND_SECONDS = 5.0
"""How long workers signalled to stop may go without passing a step boundary before they are taken to be
unable to: a healthy world passes its next one within a step."""
STEPS_PER_BOUND = 3.0
"""The bound is at least this many of the workers' last step times (a world of long steps)."""
WAIT, BOUNDARY, STUCK = "wait", "boundary", "stuck"


class Marks:
    """The marks of this launcher's workers, in ``directory`` (the launch state's). ``builtin``: its
    workers are the built-in trainer, which leaves them and stops only at a step boundary."""

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

    def read(self, pid: int) -> tuple[str, float] | None:
        """The worker ``pid``'s note and when it was written (wall clock), if it left one."""
        path = self.directory / f"{WORKER_MARK_PREFIX}{pid}"
        try:
            return path.read_text(), path.stat().st_mtime
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


def after_signal(marks: Sequence[tuple[str, float] | None], signalled_at: float, now: float) -> str:
    """What the marks of workers signalled at ``signalled_at`` (wall clock) say at ``now``: ``boundary``
    (one passed a step boundary, agreed to stop or writes a checkpoint since, or writes one now: they end
    by themselves, as torch's agent waits for), ``stuck`` (none did within the bound: at least
    :data:`STOP_BOUND_SECONDS`, or :data:`STEPS_PER_BOUND` of their last step times) or ``wait``."""
    steps = [0.0]
    for mark in marks:
        if mark is None:
            continue
        note, at = mark
        if note in (STOPPING, SAVING) or at > signalled_at:
            return BOUNDARY
        if note != FORMED:
            with contextlib.suppress(ValueError):
                steps.append(float(note))
    bound = max(STOP_BOUND_SECONDS, STEPS_PER_BOUND * max(steps))
    return STUCK if now - signalled_at >= bound else WAIT


def running(pid: int) -> bool:
    """The process ``pid`` runs (neither gone nor a zombie waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return not Path("/proc").is_dir()  # no /proc here: alive as far as can be told
    return stat.rsplit(b")", 1)[-1].split()[:1] not in ([b"Z"], [b"X"])


def _say(line: str) -> None:
    print(f"{contract.log_stamp(time.time())} [launcher] {line}", file=sys.stderr, flush=True)


def stop_promptly(
    pids: Sequence[int],
    marks: Marks,
    sig: int = signal.SIGTERM,
    say: Callable[[str], None] = _say,
    poll: float = 0.1,
) -> str:
    """Send ``sig`` to the workers ``pids`` (torch's agent sends it again, harmlessly, and waits for them)
    and wait while they may still reach a step boundary; SIGKILL them once :func:`after_signal` says they
    cannot. What it found: ``ended``, ``boundary`` (torch's agent waits for them) or ``stuck``."""
    alive = [pid for pid in pids if running(pid)]
    signalled = time.time()
    for pid in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    while alive := [pid for pid in alive if running(pid)]:
        found = after_signal([marks.read(pid) for pid in alive], signalled, time.time())
        if found == BOUNDARY:
            return found
        if found == STUCK:
            say(
                f"this pod's workers passed no step boundary in {time.time() - signalled:.1f} s since "
                f"{signal.Signals(sig).name} (they wait in a collective with a peer cut off or silent, or "
                "for one that will not come): stopping them now (SIGKILL), without a checkpoint of their own"
            )
            for pid in alive:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            return found
        time.sleep(poll)
    return "ended"
