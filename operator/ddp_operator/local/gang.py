"""A gang of local pod processes: start together, stop together, leave nothing behind.

Each pod runs in its own session (so a terminal's Ctrl-C reaches ``ddpjob local`` alone, which then stops
the pods the way the kubelet does: SIGTERM, a grace period, SIGKILL). torchrun starts its workers in
sessions of their own, and a worker can outlive a torchrun that crashed, so process groups are not enough:
every pod's environment carries a marker (``DDPJOB_LOCAL_RUN``), inherited by everything it starts, and
``stop`` kills every process whose environment has this run's marker.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Collection
from pathlib import Path
from typing import IO

MARKER = "DDPJOB_LOCAL_RUN"


def new_marker() -> str:
    return uuid.uuid4().hex


def marked(marker: str) -> list[int]:
    """Every live process (of ours) whose environment carries ``MARKER=marker``."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (``T``, by a signal such as SIGSTOP, or ``t``, by a tracer)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :][:1] in ("T", "t")


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


class Member:
    """One pod's process group, its output pumped line by line to a log file and a callback."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        log_path: Path,
        on_line: Callable[[str, str], None],
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.env = env
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if cwd is not None:
            cwd.mkdir(parents=True, exist_ok=True)
        self.tail: collections.deque[str] = collections.deque(maxlen=30)
        self._log: IO[str] = log_path.open("w", buffering=1)
        self.process = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            text=True,
            errors="replace",
        )
        self._pump = threading.Thread(target=self._read, args=(on_line,), daemon=True)
        self._pump.start()

    def _read(self, on_line: Callable[[str, str], None]) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._log.write(line)
            self.tail.append(line.rstrip("\n"))
            on_line(self.name, line.rstrip("\n"))

    def poll(self) -> int | None:
        return self.process.poll()

    def finish(self) -> None:
        self._pump.join(timeout=5)
        self._log.close()


class Gang:
    """The pods of one attempt, all marked with ``marker``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.members: list[Member] = []
        self.spared: Callable[[], Collection[int]] = tuple
        """The pids of marked processes that are not pods' (the rendezvous store, stopped by its keeper
        after the pods): :meth:`stop` does not wait for them and :meth:`kill` leaves them. Without this the
        end of every elastic run waited out the grace period for the store and then killed it under its
        keeper, which started it again and said so."""

    def _marked(self) -> list[int]:
        spared = set(self.spared())
        return [pid for pid in marked(self.marker) if pid not in spared]

    def start(self, member: Member) -> None:
        self.members.append(member)

    def last_lines(self, index: int, count: int) -> list[str]:
        """The last ``count`` lines that pod ``index`` (in start order) printed."""
        return list(self.members[index].tail)[-count:]

    def replace(self, index: int, member: Member) -> None:
        """A new process for pod ``index`` (in start order) after its last one ended, as the Job controller
        replaces a pod of an Indexed Job that failed."""
        self.members[index] = member

    def codes(self) -> list[int | None]:
        return [member.poll() for member in self.members]

    def stop(self, grace_seconds: float) -> None:
        """SIGTERM every pod, wait out the grace period, then SIGKILL whatever is left, workers included.
        The wait ends early once every process left is stopped (a frozen pod, SIGSTOP): a stopped process
        cannot act on its SIGTERM, so its grace period would only be waited out."""
        for member in self.members:
            if member.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(member.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        while time.monotonic() < deadline and (any(c is None for c in self.codes()) or self._marked()):
            left = self._marked()
            if left and all(_stopped(pid) for pid in left):
                break
            time.sleep(0.1)
        self.kill()

    def kill(self) -> None:
        """SIGKILL every pod and every process carrying this run's marker; wait for the pods."""
        for member in self.members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(member.process.pid, signal.SIGKILL)
        for _ in range(50):
            pids = self._marked()
            if not pids:
                break
            for pid in pids:
                _signal(pid, signal.SIGKILL)
            time.sleep(0.05)
        for member in self.members:
            with contextlib.suppress(subprocess.TimeoutExpired):
                member.process.wait(timeout=5)
            member.finish()
