"""What the launcher (:mod:`ddp_trainer.launch`) and its workers share, and a worker's ways out: the gang
restarts done in place and their causes (:class:`LaunchState`, kept in the file
:data:`contract.LAUNCH_STATE_ENV` names), which exit codes are never retried in place, the worker's error
for torch's error file, and :func:`exit_now`. Below the trainer's modules (which read the state and leave
through it), above nothing but :mod:`contract`; imports no torch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ddp_trainer import contract

OTHER_NODE = contract.OTHER_NODE_FAILED
ERROR_LIMIT = 240
"""Characters of the first error kept (it ends up in a metric label and the status)."""


@dataclass(frozen=True)
class LaunchState:
    """What the launcher tells its workers: the gang restarts done in place in this pod, and an elastic
    job's last world change."""

    restarts: int = 0
    cause: str = ""
    """Why the last one happened (``""`` before any)."""
    at: float = 0.0
    """Unix time the launcher saw the failure (or the re-opened rendezvous)."""
    resizes: int = 0
    """An elastic job's world changes this pod's launcher saw (no restarts: see ``Book.rendezvoused``)."""
    resize: str = ""
    """Why the last one happened, one of ``contract.RESIZE_REASONS`` (``""`` before any)."""
    resize_from: int = 0
    resize_to: int = 0
    """The nodes of the world before and after it."""
    resize_at: float = 0.0
    """Unix time the earlier world stopped: the failure or the silent peer seen, or the stop asked."""
    history: tuple[Change, ...] = ()
    """Every world change this pod's launcher saw in this attempt (the last :data:`HISTORY` of them), oldest
    first: what the operator counts, so a world it never read between two of its readings is counted
    too."""
    restart_from: str = contract.RESTART_FROM_CHECKPOINT
    """Where the last restart's workers take their state from (``contract.RESTART_FROM``): the others, where
    the launcher heals, else the last checkpoint."""


HISTORY = 32
"""World changes a launcher keeps for its workers to report."""


@dataclass(frozen=True)
class Change:
    """One world change as a launcher saw it. ``round``: the rendezvous round the new world formed in,
    the same on every node of that world, so the operator counts it once whichever pods say it (-1: not
    known, a rendezvous without torch's dynamic handler)."""

    round: int
    reason: str
    before: int
    after: int
    at: float
    mode: str = contract.RESIZE_RESTARTED
    """How the new world was made (``contract.RESIZE_MODES``): healed in place, or its workers restarted."""


def read_state(env: Mapping[str, str]) -> LaunchState:
    """The launcher's state for this worker; a fresh one without a launcher (plain torchrun)."""
    path = env.get(contract.LAUNCH_STATE_ENV, "")
    if not path:
        return LaunchState()
    try:
        data = json.loads(Path(path).read_text())
        return LaunchState(
            int(data["restarts"]),
            str(data["cause"]),
            float(data["at"]),
            int(data.get("resizes", 0)),
            str(data.get("resize", "")),
            int(data.get("resize_from", 0)),
            int(data.get("resize_to", 0)),
            float(data.get("resize_at", 0.0)),
            tuple(
                Change(int(r), str(why), int(b), int(a), float(t), *map(str, how))
                for r, why, b, a, t, *how in data.get("history", ())
            ),
            str(data.get("restart_from", contract.RESTART_FROM_CHECKPOINT)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return LaunchState()


def write_state(path: Path, state: LaunchState) -> None:
    tmp = path.with_suffix(".tmp")
    data = asdict(state)
    data["history"] = [[c.round, c.reason, c.before, c.after, c.at, c.mode] for c in state.history]
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


WORKER_MARK_PREFIX = "worker-"
FORMED = "formed"
"""What a worker tells its launcher in its mark (:func:`mark_worker`): its group formed (every rank took
part in a collective with it)."""


def worker_mark(env: Mapping[str, str], pid: int) -> Path | None:
    """Where the worker ``pid`` of this launcher leaves its mark: beside the launch state (None without a
    launcher)."""
    state = env.get(contract.LAUNCH_STATE_ENV, "")
    return Path(state).with_name(f"{WORKER_MARK_PREFIX}{pid}") if state else None


def mark_worker(path: Path | None, note: str) -> None:
    """Leave ``note`` in this worker's mark at ``path`` (:func:`worker_mark`), replacing the last: the
    launcher reads it to tell workers that formed their group from workers that still wait in the workers'
    store for a peer that will not come (:mod:`ddp_trainer.launch.workers`). Never raises."""
    if path is None:
        return
    try:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(note)
        tmp.replace(path)
    except OSError:
        pass


def first_line(message: object) -> str:
    """The first meaningful line of an error (a traceback's last line is its exception). torch's error file
    may hold a structure (``{"message": ..., "extraInfo": ...}``: a worker that failed in
    ``init_process_group`` wrote one), whose own message is taken."""
    if isinstance(message, Mapping):
        message = message.get("message", message)
    message = message if isinstance(message, str) else str(message)
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    chosen = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    return chosen[:ERROR_LIMIT]


def cause(failures: Mapping[int, tuple[int, str]]) -> str:
    """One sentence for the failed workers ``{global rank: (exit code, message)}``: the one most likely to
    have failed first names the cause (:func:`contract.blame`; the others usually failed because of it)."""
    if not failures:
        return OTHER_NODE
    sentences = [_sentence(rank, code, message) for rank, (code, message) in sorted(failures.items())]
    first = min(sentences, key=contract.blame)
    more = f" (and {len(failures) - 1} more rank(s) on this node)" if len(failures) > 1 else ""
    return first + more


def _sentence(rank: int, code: int, message: str) -> str:
    if code < 0:  # a signal's message only repeats the signal
        return f"rank {rank} killed by signal {-code}"
    detail = first_line(message)
    return f"rank {rank} exited {code}{': ' + detail if detail else ''}"


NO_RETRY = (*contract.NOT_RETRIED_EXIT_CODES, contract.INTERRUPTED_EXIT_CODE)
"""Configuration and divergence codes, and 143: a worker that stopped at SIGTERM was asked to stop from
outside (the pod is being deleted, evicted or preempted), which a restart in place would defeat."""


def not_retried(codes: Sequence[int]) -> int | None:
    """The exit code that forbids an in-place restart, if any worker exited with one (:data:`NO_RETRY`)."""
    for code in codes:
        if code in NO_RETRY:
            return code
    return None


def exit_code_of(failures: Mapping[int, int]) -> int:
    """The launcher's exit code when the agent gave up: a not-retried code if a worker had one, else 1
    (as torchrun)."""
    return not_retried(list(failures.values())) or contract.FAILURE_EXIT_CODE


def write_error_file(message: str) -> None:
    """Tell the agent this worker's error (torch's error-file format), so the cause it records is the
    worker's own words rather than only its exit code."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE", "")
    if not path:
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps({"message": message[:2000], "timestamp": int(time.time())}))
    except OSError:
        pass


def whole_lines(stream: Any) -> None:
    """Make each line printed to ``stream`` (the launcher's stderr, which shares the pod's log with its
    workers) reach the file in one write: under ``PYTHONUNBUFFERED`` (the pods') Python writes a print's text
    and its newline apart, and a worker's line landed between them (seen: the launcher's ``healed in place``
    line and rank 0's ``verified`` line on one line, which a log reader then missed). Line-buffered instead:
    a print's text waits for its newline. A stream that cannot be reconfigured is left as it is."""
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is not None:
        with contextlib.suppress(ValueError, OSError):
            reconfigure(line_buffering=True, write_through=False)


def exit_now(code: int) -> None:
    """A worker's way out: flush and leave without the interpreter's teardown. By now the report is
    written (and, in the built-in trainer, the process group destroyed); what is left is the teardown
    racing gloo's worker threads, which now and then aborted a finished worker ("terminate called without
    an active exception", SIGABRT; the mechanism: :data:`ddp_trainer.core.distributed.GLOO_SETTLE_SECONDS`),
    turning a good run into a failed one."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


FIRST, SAME, RESIZED = "first", "same", "resized"
UNCHANGED = "unchanged"
"""What :class:`~ddp_trainer.launch.book.Book` makes of an elastic job's ``same`` world after a stop this pod
did not cause: not a restart of its own (see ``Book.rendezvoused``)."""


def world_change(before: int, after: int) -> str:
    """What a rendezvous of ``after`` nodes is, after one of ``before`` (0: none yet): the ``first``, the
    ``same`` world again (a restart in place: a rank of this gang failed, here or on another node), or a
    ``resized`` one (an elastic job's: a node lost or joined)."""
    if before == 0:
        return FIRST
    return SAME if after == before else RESIZED
