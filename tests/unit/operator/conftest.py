from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml


@pytest.fixture
def write_yaml(tmp_path: Path) -> Callable[..., Path]:
    """Write documents to a temporary YAML file and return its path."""

    def write(*docs: Any, name: str = "job.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        return path

    return write


@pytest.fixture(autouse=True)
def _each_status_built_reads_typed_and_writes_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every status the builder writes in these tests, read into the typed status (api/typed_status.py) and
    written back, is the same mapping (issue 56 item 1): the typed status holds all the builder can write."""
    from ddp_operator.api import typed_status
    from ddp_operator.decide.status_builder import StatusBuilder

    build = StatusBuilder.plan

    def checked(self: StatusBuilder, *saids: Any, **steps: Any) -> Any:
        plan = build(self, *saids, **steps)
        assert typed_status.write(typed_status.read(plan.status)) == plan.status, plan.status
        return plan

    monkeypatch.setattr(StatusBuilder, "plan", checked)
