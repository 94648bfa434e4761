"""pytest plugin: the trainer tests' fixture ``single_rank`` (unit and integration tiers alike)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import prometheus_client.values as prometheus_values
import pytest
import torch.distributed as dist

from ddp_trainer import contract


@pytest.fixture
def single_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A one-rank process group (in-memory store), this test's own metrics folder and report file."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "metrics"))
    # SyncHealth switches an already imported prometheus_client to multiprocess values (as in a user's
    # process); put the single-process values back afterwards, or later tests' counters would add up
    # in files of a removed folder
    monkeypatch.setattr(prometheus_values, "ValueClass", prometheus_values.ValueClass)
    monkeypatch.setenv(contract.METRICS_PORT_ENV, "0")
    monkeypatch.setenv(contract.TERMINATION_LOG_ENV, str(tmp_path / "report.json"))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]
    try:
        yield tmp_path / "report.json"
    finally:
        dist.destroy_process_group()
