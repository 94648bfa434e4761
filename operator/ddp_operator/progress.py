"""What a person watching a run sees: training progress read from the pods' own /metrics, and the
sync report in one sentence.

``ddpjob local`` scrapes the same Prometheus endpoints a cluster's Prometheus would, so the progress line
shows exactly what the metrics say. Parsing and formatting are pure; ``scrape`` is the only I/O.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ddp_trainer import contract


@dataclass(frozen=True)
class Progress:
    """Training progress across every rank that has reported."""

    step: int = 0
    samples: float = 0.0
    loss: float | None = None
    checks_ok: int = 0
    checks_mismatch: int = 0
    ranks: int = 0


def scrape(port: int, timeout: float = 0.5) -> str | None:
    """The text of http://127.0.0.1:PORT/metrics, or None while nothing answers there."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as response:
            text: str = response.read().decode()
            return text
    except OSError:
        return None


def parse(texts: Iterable[str]) -> Progress:
    """Progress from the exposition texts of every pod (each pod shows all of its local ranks)."""
    steps: dict[str, float] = {}
    samples: dict[str, float] = {}
    losses: dict[str, float] = {}
    checks: dict[tuple[str, str, str], float] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                rank = sample.labels.get(contract.RANK_LABEL, "")
                if sample.name == contract.counter_sample(contract.STEPS):
                    steps[rank] = sample.value
                elif sample.name == contract.counter_sample(contract.SAMPLES):
                    samples[rank] = sample.value
                elif sample.name == contract.LOSS:
                    losses[rank] = sample.value
                elif sample.name == contract.counter_sample(contract.SYNC_CHECKS):
                    key = (rank, sample.labels.get("kind", ""), sample.labels.get("result", ""))
                    checks[key] = sample.value
    by_result = _sum_by_result(checks)
    return Progress(
        step=int(min(steps.values())) if steps else 0,
        samples=sum(samples.values()),
        loss=losses.get("0", next(iter(losses.values()), None)),
        # Every rank takes part in every check: count rank 0's, or any one rank's when 0 is not shown.
        checks_ok=int(by_result.get(contract.CHECK_RESULT_OK, 0)),
        checks_mismatch=int(by_result.get(contract.CHECK_RESULT_MISMATCH, 0)),
        ranks=len(steps),
    )


def _sum_by_result(checks: Mapping[tuple[str, str, str], float]) -> dict[str, float]:
    """Checks of every kind by result, as one rank saw them (rank 0 when it is shown)."""
    ranks = sorted({rank for rank, _, _ in checks}, key=lambda r: (r != "0", r))
    if not ranks:
        return {}
    chosen = ranks[0]
    out: dict[str, float] = {}
    for (rank, _, result), value in checks.items():
        if rank == chosen:
            out[result] = out.get(result, 0.0) + value
    return out


def line(progress: Progress, total_steps: int, elapsed: float, first: Progress | None = None) -> str:
    """One line: step/total, loss, samples/s since the first reading, and the sync checks so far."""
    percent = 100.0 * progress.step / total_steps if total_steps else 0.0
    loss = f"{progress.loss:.4f}" if progress.loss is not None else "-"
    base_samples = first.samples if first else 0.0
    rate = f"{(progress.samples - base_samples) / elapsed:,.0f}" if elapsed > 0.5 else "-"
    checks = f"{progress.checks_ok} ok"
    if progress.checks_mismatch:
        checks += f", {progress.checks_mismatch} MISMATCH"
    return (
        f"step {progress.step}/{total_steps} ({percent:.0f}%)  loss {loss}  {rate} samples/s  "
        f"sync checks: {checks}"
    )


def sync_sentence(report: Mapping[str, Any] | None) -> str:
    """The sync report in one sentence a person reads at a glance."""
    if not report:
        return "not reported (the command is not the ddpjob trainer, or it stopped before its report)"
    checks, ranks = report.get("checks", 0), report.get("worldSize", "?")
    if report.get("verified"):
        repaired = f", after {report['repairs']} repair(s)" if report.get("repairs") else ""
        return (
            f"replicas verified bit-identical {checks} times across {ranks} ranks{repaired} "
            f"(last check at step {report.get('lastCheckStep')})"
        )
    tensors = ", ".join(report.get("mismatchedTensors", [])[:5]) or "unknown tensors"
    return (
        f"replicas DIVERGED: {report.get('mismatches', 0)} of {checks} checks found ranks differing "
        f"({tensors}); {report.get('message', '')}"
    )
