"""The compute probe as :class:`~ddp_trainer.sync.health.SyncHealth` drives it: started when it is built
(with the SDC fire drill when that names this rank), due every ``probe_every`` steps right after a check that
passed, its verdict in the metrics, the log and the report; a faulty rank under ``onFaultyRank: Fail`` is a
:class:`~ddp_trainer.sync.probe.FaultyRankError`. The probe itself is :mod:`ddp_trainer.sync.probe`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ddp_trainer import contract
from ddp_trainer.core.config import PodEnv
from ddp_trainer.reporting import report
from ddp_trainer.sync import probe
from ddp_trainer.sync.checking import Checking
from ddp_trainer.sync.corruption_drill import install_sdc_drill
from ddp_trainer.sync.settings import SyncConfig

log = logging.getLogger("ddp_trainer")


class Probing(Checking):
    """The compute probe's side of :class:`~ddp_trainer.sync.health.SyncHealth`."""

    config: SyncConfig
    pod: PodEnv

    def _start_probe(
        self,
        model: nn.Module,
        batch: Any,
        loss: Callable[[nn.Module], torch.Tensor] | None,
        step: probe.StepFn | None,
        *,
        drill: bool = True,
    ) -> None:
        """The compute probe (:mod:`ddp_trainer.sync.probe`) when on, and (``drill``: not again in a healed
        world) the SDC fire drill when it names this rank."""
        self.probe_every, self.on_faulty_rank = self.config.probe_every, self.config.on_faulty_rank
        self.probes = 0
        self.last_probe: probe.ProbeResult | None = None
        self.faulty_found = 0
        self.last_faulty: probe.ProbeResult | None = None
        self.prober: probe.Probe | None = None
        if self.probe_every and self.layout is not None:
            self.probe_every = 0
            log.log(
                logging.WARNING if self.rank == 0 else logging.DEBUG,
                "the compute probe is off for %s: a sharded forward is collective over the shard "
                "dimension, so one rank's compute cannot be told apart (docs/your-code.md, HSDP)",
                self.layout.kind,
            )
        if self.probe_every:
            group = self.peers if self.peers is not None else self.group
            self.prober = probe.Probe(
                model, group=group, batch=batch, loss=loss, step=step, node=self.pod.node
            )
            self.metrics.start_probe(self.probe_every, self.pod.node, self.prober.pod)
        sdc = self.pod.sdc
        if drill and sdc is not None and sdc.rank == self.rank:
            install_sdc_drill(model, lambda: self.current_step >= sdc.step)
            log.warning(
                "fire drill: rank %d computes wrong after step %d (%s)",
                self.rank,
                sdc.step,
                contract.CHAOS_SDC_ENV,
            )

    def probe_due(self) -> bool:
        """Whether the compute probe runs at this step (right after the check it needs)."""
        return self.prober is not None and probe.due(self.current_step, self.probe_every)

    def run_probe(self) -> probe.ProbeResult:
        """One compute probe now (collective; call right after a check that passed): metrics, log, and
        under ``onFaultyRank: Fail`` a :class:`ddp_trainer.sync.probe.FaultyRankError` when a rank is named
        faulty. Undecidable and flaky verdicts are said, never acted on."""
        assert self.prober is not None, "the compute probe is off"
        result = self.prober.run(self.current_step)
        self.probes += 1
        self.last_probe = result
        kind = result.verdict.kind
        if self.metrics.probe is not None:
            named = self.rank in result.verdict.ranks
            self.metrics.probe.observe(kind, named, result.seconds, time.time())
        if kind == "agree":
            return result
        if self.rank == 0:
            log.warning("%s", result.message)
        if kind == "faulty":
            self.faulty_found += 1
            self.last_faulty = result
            if self.on_faulty_rank == "Fail":
                raise probe.FaultyRankError(result)
        return result

    def probe_summary(self, rep: contract.Report) -> contract.Report:
        """``rep`` with the probes run, the last one's verdict and why, and, when one named a faulty rank
        (under ``Warn``), where."""
        if self.prober is not None:
            rep["probes"] = self.probes
        if (last := self.last_probe) is not None:
            rep["probeVerdict"], rep["probeWhy"] = last.verdict.kind, last.message
        if (found := self.last_faulty) is not None:
            report.with_faulty(rep, found)
        return rep
