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
