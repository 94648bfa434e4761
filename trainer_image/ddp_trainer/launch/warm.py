"""Warm restarts for the built-in trainer (the launcher's third addition, :mod:`ddp_trainer.launch.agent`):
``--module ddp_trainer`` (the image's default) runs as a function entrypoint under the ``forkserver``
start method, with torch pre-imported in the fork server (:data:`PRELOAD`): each worker, the first ones
and those of every restart in place, is a fork of a process that has already paid Python's and torch's
start. Each forked worker is named by its global rank; torch's failure path is imported ahead, in the
background."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

BUILTIN_MODULE = "ddp_trainer"


PRELOAD = ("torch", "torch._dynamo")
"""What the fork server imports once, before it forks any worker of the built-in trainer: torch, nearly all
of a worker's start, and ``torch._dynamo``, which the worker's first optimizer imports (torch wraps
``Optimizer.__init__`` in ``torch._disable_dynamo``, which imports it on its first call): 2.0 s of CPU in a
fresh process, 3.3-3.6 s between a worker's process group forming and its restore on two cores with the
job's other pods beside it, in every new world's start (measured for issue 54's loss as a world's workers
start; it initializes no CUDA, so forking after it is safe). Not the trainer's own modules (25 ms): one
of them is :mod:`ddp_trainer.launch.agent`, which each forked worker runs again as its ``__mp_main__``
(multiprocessing's way), and runpy warns when it is already imported; nor ``prometheus_client``, which
must be imported after ``PROMETHEUS_MULTIPROC_DIR`` is set."""


def runs_builtin(args: Any) -> bool:
    """torchrun's parsed ``args`` start the built-in trainer (``--module ddp_trainer``)."""
    return (
        bool(args.module) and args.training_script == BUILTIN_MODULE and not (args.no_python or args.run_path)
    )


def builtin_worker(*argv: str) -> None:
    """One worker of the built-in trainer, forked from the pre-imported fork server. A clean end returns
    (the agent collects the return value); any other leaves with the trainer's exit code, which the agent
    reads from the process. The interpreter's teardown never runs in a forked worker (multiprocessing ends
    it with ``os._exit``), so the abort at exit :func:`exit_now` avoids cannot happen here."""
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # torchrun runs python -u
    name_process(f"{WORKER_NAME_PREFIX}{os.environ.get('RANK', '')}")
    import ddp_trainer.__main__

    code = ddp_trainer.__main__.main(list(argv))
    logging.shutdown()
    if code:
        sys.exit(code)


SOCKET_DIR_LIMIT = 64
"""The longest temp dir the fork server's socket may live under: its path (the dir, ``/pymp-…/listener-…``)
must fit a UNIX socket address (107 bytes on Linux); ``ddpjob local`` gives each pod a deep one."""


def start_fork_server() -> None:
    """Start the fork server now, so that it imports torch while the agent meets the others at the
    rendezvous; its socket goes under ``/tmp`` where the temp dir's path is too long for one."""
    import multiprocessing
    from multiprocessing import forkserver

    multiprocessing.set_forkserver_preload(list(PRELOAD))
    saved = tempfile.tempdir
    if len(tempfile.gettempdir()) > SOCKET_DIR_LIMIT and os.path.isdir("/tmp"):
        tempfile.tempdir = "/tmp"
    try:
        forkserver.ensure_running()
        _Server.started = True
    finally:
        tempfile.tempdir = saved


class _Server:
    """Whether this launcher started a warm fork server (:func:`start_fork_server`)."""

    started = False


READY_SECONDS = 60.0
"""How long a node that joins a running world waits for its fork server's preload (:func:`before_joining`)."""


def _forked() -> None:
    """A process forked from the fork server, which ends at once (:func:`fork_server_ready`)."""


def fork_server_ready(seconds: float = READY_SECONDS) -> bool:
    """Whether this launcher's fork server took its preload within ``seconds``: it forks a process only once
    it has (its loop begins after), so a process forked from it that ended says so."""
    import multiprocessing

    process = multiprocessing.get_context("forkserver").Process(target=_forked, daemon=True)
    process.start()
    process.join(seconds)
    return process.exitcode == 0


def before_joining(members: int, say: Callable[[str], None]) -> None:
    """Before this node's first rendezvous, where it joins a world of ``members`` nodes that trains
    (:func:`ddp_trainer.launch.heal_meeting.joining`): the world pauses from the moment this node waits in
    the rendezvous until its fresh workers copied their state, so it waits first for its fork server's
    preload (torch, imported once for every worker: about 2 s of CPU, measured on two busy cores as the
    larger part of a healed grow's 2.9 s pause), which a node that starts with the others does while they
    meet. Nothing where no world trains or the launcher runs no warm fork server (a user's script)."""
    if not members or not _Server.started:
        return
    started = time.monotonic()
    say(
        f"a world of {members} node(s) trains: this node joins it once its workers can start at once (its "
        f"fork server imports torch first, up to {READY_SECONDS:.0f} s)"
    )
    ready = fork_server_ready()
    took = time.monotonic() - started
    say(f"the fork server {'is ready' if ready else 'did not answer'} after {took:.1f} s: joining the world")


WORKER_NAME_PREFIX = "ddpjob-rank-"
"""A forked worker's process name (``/proc/<pid>/comm``, what ``ps`` and ``top`` show), with its global
rank: its command line and environment are the fork server's, which name no rank."""


def name_process(name: str) -> None:
    """Set this process's name (Linux ``prctl(PR_SET_NAME)``, 15 characters); elsewhere nothing."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # 15 = PR_SET_NAME
    except (OSError, AttributeError):
        pass


class _FailurePath:
    """Whether this agent warms torch's failure path (the built-in trainer's), and whether it began."""

    wanted = False
    began = False


def warm_failure_path() -> None:
    """Import ``torch._dynamo`` now, in the background, once the agent's first rendezvous returned (asked by
    :func:`warm_config_from_args`): torch's log formatter imports it the first time the agent logs a
    worker's failure with its traceback (torch's multiprocessing context does), which took 0.9-1.3 s of
    every first restart in place on two busy cores. Not while the agent meets its first round: the import
    holds the interpreter's lock for seconds of CPU, and each of the agent's writes of torch's rendezvous
    state is a compare-and-set that it lost, slowed, to the others' keep-alives again and again (a node
    joining a world that heals missed its round under a build's load)."""
    if not _FailurePath.wanted or _FailurePath.began:
        return
    _FailurePath.began = True

    def load() -> None:
        with contextlib.suppress(Exception):
            importlib.import_module("torch._dynamo")

    threading.Thread(target=load, name="ddpjob-warm-import", daemon=True).start()


def warm_config_from_args(config_from_args: Any) -> Any:
    """torchrun's ``config_from_args``, turned to the built-in trainer's function entrypoint on a warm
    fork server (torchrun's ``run`` keeps its own rendezvous defaults around it)."""

    def warm(args: Any) -> tuple[Any, Any, list[str]]:
        config, _, _ = config_from_args(args)  # sets OMP_NUM_THREADS=1 (more than one worker per node)...
        config.start_method = "forkserver"
        start_fork_server()  # ...which torch reads when it loads: the fork server must see it
        _FailurePath.wanted = True  # warmed after the first rendezvous (warm_failure_path)
        return config, builtin_worker, list(args.training_script_args)

    return warm
