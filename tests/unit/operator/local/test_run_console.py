"""What ``ddpjob local`` says while it stops a gang (:mod:`ddp_operator.local.run`), with no process
started: a stand-in gang whose pod 0 prints torchrun's traceback of the SIGTERM that ddpjob sent it."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddp_operator.api.spec import parse
from ddp_operator.local import run
from ddp_operator.local.console import Console, Interrupt

DOC = {
    "apiVersion": "ddpjob.io/v1alpha1",
    "kind": "DDPJob",
    "metadata": {"name": "mingpt"},
    "spec": {"nodes": 2, "device": "cpu", "command": ["torchrun"], "args": ["main.py"]},
}
TRACEBACK = [
    "Traceback (most recent call last):",
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 4242 got signal: 15",
]


@dataclass
class Pod:
    name: str
    metrics_port: int = 0
    log_path: Path = Path("/nonexistent")


class Gang:
    """Node 1 killed by SIGKILL; node 0 prints the traceback of ddpjob's SIGTERM while it is stopped."""

    def __init__(self, console: Console) -> None:
        self.console, self.stopped = console, False

    def codes(self) -> list[int | None]:
        return [1, -9] if self.stopped else [None, -9]

    def stop(self, grace_seconds: float) -> None:
        for line in TRACEBACK:
            self.console.pod_line("mingpt-1-0", line)
        self.stopped = True


def test_a_traceback_caused_by_ddpjobs_own_stop_is_labelled_so_after_the_line_that_blames_node_1() -> None:
    out = io.StringIO()
    console = Console(out, verbose=False, shown=frozenset(["mingpt-1-0"]))
    pods = [Pod("mingpt-1-0"), Pod("mingpt-1-1")]
    first, last = run._watch(parse(DOC), pods, Gang(console), console, Interrupt())  # type: ignore[arg-type]
    assert (first, last) == ([None, -9], [1, -9])
    lines = out.getvalue().splitlines()
    assert lines == [
        "mingpt-1-1 was killed by SIGKILL (exit -9): stopping the other pods (SIGTERM); a traceback they "
        "print now is that stop's, not a failure of their own",
        *(f"[mingpt-1-0, after ddpjob's SIGTERM] {line}" for line in TRACEBACK),
    ]
    console.pod_line("mingpt-1-0", "a line of the next attempt")
    assert out.getvalue().splitlines()[-1] == "[mingpt-1-0] a line of the next attempt"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_progress_line_only_when_the_step_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A script that validates for a while stays at one step: its line is said once, in a log (a line at
    most every 10 s) as on a terminal (the live line)."""
    clock = [0.0]
    monkeypatch.setattr(run.time, "monotonic", lambda: clock[0])
    log = io.StringIO()
    console = Console(log, verbose=False)
    for second, step in [(0, 3), (12, 4), (24, 4), (36, 4), (48, 4), (50, 5), (55, 6), (66, 6), (70, 7)]:
        clock[0] = float(second)
        console.progress(f"step {step}  sync checks: 2 ok", step)
    assert log.getvalue().splitlines() == [f"step {step}  sync checks: 2 ok" for step in (4, 5, 6)]

    terminal = Terminal()
    live = Console(terminal, verbose=False)
    for step in [4, 4, 4, 5, 5]:
        live.progress(f"step {step}", step)
    assert terminal.getvalue() == "\r\x1b[2Kstep 4\r\x1b[2Kstep 5"
