"""How a pod's exit reads (:mod:`ddp_operator.api.exits`): a signal by its name, in local mode (Python's
``-N``) and in a cluster (the container's ``128 + N``)."""

from __future__ import annotations

import pytest

from ddp_operator.api import exits


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (-9, "was killed by SIGKILL (exit -9)"),
        (137, "was killed by SIGKILL (exit 137)"),
        (-11, "was killed by SIGSEGV (exit -11)"),
        (134, "was killed by SIGABRT (exit 134)"),
        (-15, "was stopped by SIGTERM (exit -15)"),
        (143, "was stopped by SIGTERM (exit 143)"),
        (1, "exited 1"),
        (86, "exited 86"),  # the trainer's own codes are no signal
        (128, "exited 128"),
        (255, "exited 255"),  # 128 + 127: no such signal
    ],
)
def test_an_exit_by_a_signal_reads_by_its_name(code: int, text: str) -> None:
    assert exits.exited(code) == text
