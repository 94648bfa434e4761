"""What a report reads of the sync check's tally and of the compute probe's finding, named here as
``Protocol`` s: ``sync`` sits above ``reporting`` in the layers, so :mod:`ddp_trainer.reporting.report`
does not import the classes themselves (:class:`ddp_trainer.sync.checking.Tally`,
:class:`ddp_trainer.sync.probe.ProbeResult`), and stays torch-free."""

from __future__ import annotations

from typing import Protocol


class SyncTally(Protocol):
    """The sync checks counted so far (:class:`ddp_trainer.sync.checking.Tally` is one)."""

    checks: int
    mismatches: int
    repairs: int
    last_check_step: int
    mismatched_tensors: list[str]
    diverged_ranks: list[int]
    max_abs_diff: float

    @property
    def verified(self) -> bool: ...


class FaultyRanks(Protocol):
    """The ranks a probe's verdict names (:class:`ddp_trainer.sync.probe.Verdict` is one)."""

    @property
    def ranks(self) -> tuple[int, ...]: ...


class ProbeFinding(Protocol):
    """A probe's verdict with the pods, nodes and devices of its ranks
    (:class:`ddp_trainer.sync.probe.ProbeResult` is one)."""

    @property
    def verdict(self) -> FaultyRanks: ...
    @property
    def pods(self) -> tuple[str, ...]: ...
    @property
    def nodes(self) -> tuple[str, ...]: ...
    @property
    def devices(self) -> tuple[str, ...]: ...
    @property
    def message(self) -> str: ...
