"""Background processes that outlive the command that started them, tracked by pid files.

A pid file holds the pid and the process's start time (field 22 of ``/proc/<pid>/stat``), so a stop
never signals an unrelated process that happened to get a recycled pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def name(pid: int) -> str:
    """The process's name (``/proc/<pid>/comm``, what ``ps`` shows), ``""`` once it is gone: a built-in
    trainer's worker, a fork with its fork server's command line and environment, says its rank there."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    pid_file: Path,
    log_file: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Starts ``argv`` in its own session (so it survives us and can be stopped as a group)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    pid_file.write_text(f"{proc.pid} {_start_time(proc.pid) or ''}\n")
    return proc


def read_pid(pid_file: Path) -> int | None:
    """The live process ``pid_file`` names, or None (no file, gone, or the pid was reused)."""
    try:
        fields = pid_file.read_text().split()
    except OSError:
        return None
    if not fields:
        return None
    pid = int(fields[0])
    started = _start_time(pid)
    if started is None or (len(fields) > 1 and fields[1] != started):
        return None
    return pid


def _alive(pid: int) -> bool:
    """Running (a zombie counts as gone: it only waits for its parent to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def stop(pid_file: Path, *, grace: float = 10.0) -> bool:
    """SIGTERM to the process group ``pid_file`` names, SIGKILL after ``grace`` s; removes the file.
    Returns whether a process was running."""
    pid = read_pid(pid_file)
    pid_file.unlink(missing_ok=True)
    if pid is None:
        return False
    return stop_group(pid, grace=grace)


def kill_group(pid: int) -> None:
    """SIGKILL to process group ``pid`` at once (no SIGTERM: nothing gets to clean up), and waits for it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def stop_group(pid: int, *, grace: float) -> bool:
    """SIGTERM to process group ``pid`` (a session leader we started), SIGKILL after ``grace`` s."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _alive(pid):
            break
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)  # also any child the leader left behind
    return True
