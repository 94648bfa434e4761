"""How one attempt ended, as observed (a value; :mod:`ddp_operator.decide.restarts` decides what follows)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Outcome:
    """How one attempt ended, as observed: per-pod exit codes and rank 0's termination report."""

    succeeded: bool
    exit_codes: Mapping[int, int] = field(default_factory=dict)
    report: Mapping[str, Any] | None = None
    reason: str = ""
    message: str = ""
    crashed: bool = False
    """A pod failed on its own (not deleted, not stopped by SIGTERM): the others were stopped because of
    it, so their ``Interrupted`` report does not make the attempt a preemption."""
