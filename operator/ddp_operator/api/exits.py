"""How a pod's exit reads in what a person sees: ``node 1 exited 1``, and a signal by its name, ``node 1 was
killed by SIGKILL (exit -9)``. One wording for the operator (a container's code: 128 + the signal) and for
``ddpjob local`` (Python's: minus the signal)."""

from __future__ import annotations

import signal


def signal_of(code: int) -> signal.Signals | None:
    """The signal that ended a process with exit ``code``: ``-N`` (Python's ``returncode`` of a process a
    signal killed) or ``128 + N`` (the shell's and the container runtime's), or None."""
    number = -code if code < 0 else code - 128 if 128 < code < 128 + signal.NSIG else 0
    try:
        return signal.Signals(number) if number > 0 else None
    except ValueError:
        return None


def exited(code: int) -> str:
    """What a process that ended with ``code`` did: ``exited 1``, ``was killed by SIGKILL (exit -9)``,
    ``was stopped by SIGTERM (exit 143)``."""
    sig = signal_of(code)
    if sig is None:
        return f"exited {code}"
    how = "stopped" if sig in (signal.SIGTERM, signal.SIGINT) else "killed"  # a stop it may have caught
    return f"was {how} by {sig.name} (exit {code})"
