"""Where the ``ddp_trainer`` logger's lines go in a process ddpjob started: its own handler on stderr, never
through the script's root logger.

A user's script configures its root logger as it likes (``logging.basicConfig(filename=...)``, hydra's
``main.log``); the sync checks' lines must not land there once per rank. :func:`configure` gives the
``ddp_trainer`` logger (and so its children: ``ddp_trainer.reporting.report``, ...) a stderr handler of its
own, in the built-in trainer's format, and stops it propagating: one line per check, from rank 0 (the other
ranks say only warnings and errors: a rank that differs). The no-code-change hook calls it when it installs
(:mod:`ddp_trainer.hook.autoinstrument`), the built-in trainer at its start. A script that builds
``SyncHealth`` or a callback itself keeps Python's usual way for a library: the lines propagate to its own
logging. ``docs/your-code.md`` says how to route the hook's lines into the script's own logging.
"""

from __future__ import annotations

import logging
import sys

NAME = "ddp_trainer"
"""The logger every module of the trainer logs under (or under a child of it)."""


def line_format(rank: int | str) -> str:
    """The format of the trainer's lines: ``2026-11-28 02:33:22,101 [rank 0] INFO step 10: ...``."""
    return f"%(asctime)s [rank {rank}] %(levelname)s %(message)s"


class OwnHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`configure` adds (a class of its own, so that it is found again, never twice)."""


def configure(rank: int | str) -> logging.Logger:
    """Give the ``ddp_trainer`` logger its own stderr handler (INFO on rank 0, WARNING elsewhere) and stop
    it propagating to the root logger. Once per process: a logger that already has a handler (the
    script's or a framework's own configuration of it, or this one) is left as it is."""
    log = logging.getLogger(NAME)
    if log.handlers:
        return log
    handler = OwnHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(line_format(rank)))
    log.addHandler(handler)
    log.setLevel(logging.INFO if str(rank) == "0" else logging.WARNING)
    log.propagate = False
    return log
