"""Where the trainer's and the hook's lines go (:mod:`ddp_trainer.reporting.logs`): their own stderr
handler, never the script's root logger."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

from ddp_trainer import inject
from ddp_trainer.reporting import logs
from helpers import REPO

SCRIPT = REPO / "tests" / "helpers" / "own_logging.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_script_that_logs_to_its_own_file_finds_none_of_the_hooks_lines_there(tmp_path: Path) -> None:
    """The script calls ``logging.basicConfig(filename=...)`` before it imports torch, as public scripts
    do; under the hook (one rank, gloo) the checks are on stderr, once each, and its file holds its own
    lines only."""
    hook = tmp_path / "hook"
    assert inject.main([str(hook)]) == 0
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DDPJOB_", "PYTHONPATH"))},
        "PYTHONPATH": str(hook),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "DDPJOB_SYNC_EVERY": "5",
        "DDPJOB_TERMINATION_LOG": str(tmp_path / "report.json"),
        "OMP_NUM_THREADS": "1",
    }
    own = tmp_path / "main.log"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--log-file", str(own), "--steps", "10"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    mine = own.read_text()
    assert "[train][INFO] - rank 0 step 10 loss" in mine, mine
    assert "ddp_trainer" not in mine and "check passed" not in mine and "sync health" not in mine, mine
    for kind in ("step 5: periodic", "step 10: periodic"):  # the hook's lines: on stderr, once each
        assert done.stderr.count(f"[rank 0] INFO {kind} check passed (") == 1, done.stderr


def test_configure_adds_one_handler_and_leaves_a_configured_logger_alone() -> None:
    """Once per process, INFO on rank 0 and WARNING elsewhere; a logger that the script (or this) already
    gave a handler is left as it is. Restored after: other tests read the logger through the root."""
    log = logging.getLogger(logs.NAME)
    saved = (list(log.handlers), log.level, log.propagate)
    try:
        log.handlers.clear()
        assert logs.configure(1) is log
        assert [type(h) for h in log.handlers] == [logs.OwnHandler] and not log.propagate
        assert log.level == logging.WARNING
        assert log.handlers[0].formatter is not None
        assert log.handlers[0].formatter._fmt == "%(asctime)s [rank 1] %(levelname)s %(message)s"
        logs.configure(0)
        assert len(log.handlers) == 1 and log.level == logging.WARNING  # the first call's, kept

        log.handlers[:] = [logging.NullHandler()]  # the script's own configuration of it
        log.propagate, log.level = True, logging.NOTSET
        logs.configure(0)
        assert [type(h) for h in log.handlers] == [logging.NullHandler] and log.propagate
    finally:
        log.handlers[:], log.level, log.propagate = saved
