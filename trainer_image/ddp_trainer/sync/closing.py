"""The end of a :class:`~ddp_trainer.sync.health.SyncHealth` run: the final check (or the ranks'
agreement that they end at the same step), the termination report for each way a run ends (finished,
diverged, a faulty rank, the user's code failed), written by local rank 0, and the exit a verdict ends the
process with; also what makes the report be written when the run ends by an exception nobody catches, or
leaves a ``with`` block.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from types import TracebackType
from typing import Self

import torch.distributed as dist

from ddp_trainer import contract
from ddp_trainer.core import inplace
from ddp_trainer.core.distributed import LaunchEnv
from ddp_trainer.reporting import report
from ddp_trainer.sync import probe
from ddp_trainer.sync.checking import DivergenceError
from ddp_trainer.sync.checking import model_digest as digest_of
from ddp_trainer.sync.probing import Probing

log = logging.getLogger("ddp_trainer")

REPORTED = (contract.DIVERGENCE_EXIT_CODE, contract.FAULTY_RANK_EXIT_CODE)
"""Exit codes :class:`SyncHealth` raises (``SystemExit``) after writing the report itself."""


def verdict_exit(code: int) -> SystemExit:
    """The ``SystemExit`` a verdict ends the process with (its report written). In a launched worker
    (torchrun sets ``TORCHELASTIC_RUN_ID``) an exit handler, run first, then leaves with ``os._exit(code)``:
    the interpreter's teardown with the script's process group still alive can abort the process (torch's
    gloo: "terminate called without an active exception", SIGABRT), and the launcher would then report
    the abort instead of the verdict."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        atexit.register(inplace.exit_now, code)
    return SystemExit(code)


class Closing(Probing):
    """How a :class:`~ddp_trainer.sync.health.SyncHealth` run ends, and its report."""

    closed: bool
    last_report: contract.Report | None
    total_steps: int | None
    world_size: int
    resumed_from: int
    launch: LaunchEnv
    write_report: bool

    def close(self, error: BaseException | None = None, *, collective: bool = True) -> None:
        """The final check (when the run ended normally and the last step was not checked) and the
        termination report (local rank 0 writes it); idempotent. A divergence at the final check under
        ``Fail`` exits like one at any other check. ``collective=False``: the process group is gone, so
        only the report (of the checks done so far)."""
        if self.closed:
            return
        self.closed = True
        try:
            self._close(error, collective)
        finally:
            self._release_peers()

    def _release_peers(self) -> None:
        """Destroy the header's own gloo group once the last check is done, so no thread of it outlives the
        run into the interpreter's exit (where a gloo group left alive can abort the process)."""
        peers, self.peers = self.peers, None
        if peers is not None and dist.is_initialized():
            try:
                dist.destroy_process_group(peers)
            except Exception as err:  # the run's result stands; say it once
                log.debug("could not destroy the sync check's own group: %s", err)

    def _close(self, error: BaseException | None, collective: bool) -> None:
        if error is None and not collective:
            self._publish(*self.finished())
        elif error is None:
            try:
                if self.tally.last_check_step != self.current_step:
                    self.check("final")
                else:
                    self.agree(
                        "end-of-run agreement"
                    )  # the ranks end at the same step (cheap: one small all-reduce)
            except DivergenceError as err:
                self._publish(*self.diverged(err))
                raise verdict_exit(contract.DIVERGENCE_EXIT_CODE) from err
            except BaseException as err:
                self._publish(*self.failed(err))
                raise
            self._publish(*self.finished())
        elif isinstance(error, DivergenceError):
            self._publish(*self.diverged(error))
        elif isinstance(error, probe.FaultyRankError):
            self._publish(*self.faulty(error))
        elif isinstance(error, KeyboardInterrupt):
            self._publish(*self.finished())  # the step count says it stopped early
        else:
            self._publish(*self.failed(error))

    def facts(self) -> report.RunFacts:
        return report.RunFacts(self.current_step, self.world_size, self.resumed_from, self.pod.attempt)

    def finished(self) -> tuple[int, contract.Report]:
        total = self.total_steps if self.total_steps is not None else self.current_step
        code, rep = report.finished(self.tally, self.facts(), total, digest_of(self.subject.model))
        return code, self.probe_summary(rep)

    def faulty(self, err: probe.FaultyRankError) -> tuple[int, contract.Report]:
        found = err.result
        code, rep = report.faulty(found, self.tally, self.facts())
        rep["probes"] = self.probes
        return code, rep

    def diverged(self, err: DivergenceError) -> tuple[int, contract.Report]:
        return report.diverged(self.tally, self.facts(), err.reason, str(err))

    def failed(self, err: BaseException) -> tuple[int, contract.Report]:
        """The report when the user's code raised: reason ``CommandError`` (not the built-in trainer's)."""
        message = f"{type(err).__name__}: {err}"
        return report.failed(message, self.tally, self.facts(), reason=contract.COMMAND_ERROR)

    def _publish(self, code: int, rep: contract.Report) -> None:
        if self.layout is not None:
            rep["sharding"] = self.layout.describe()
        self.last_report = rep
        if not self.write_report:
            return
        if self.launch.local_rank == 0:
            report.write_termination_message(self.pod.termination_log, rep)
        if self.rank == 0:
            log.info("sync health report: %s", report.termination_message(rep))

    def close_on_uncaught_exception(self) -> None:
        """Write the report also when an exception nobody catches ends the process (for frameworks whose
        loops give a callback no way to see it): chains ``sys.excepthook``."""
        previous = sys.excepthook

        def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
            if not (isinstance(error, SystemExit) and error.code in REPORTED):
                self.close(error)
            previous(kind, error, tb)

        sys.excepthook = hook

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(error, SystemExit) and error.code in REPORTED:
            return  # the report is written
        self.close(error)
