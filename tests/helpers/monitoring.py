"""What the monitoring tests share: the chart's alert rules and dashboard, the real promtool/prometheus:
Prometheus 3, built from its Go module by ``hack/monitoring/build.sh`` (``make test`` builds it), else
Debian's 2.42 (``hack/install_prometheus.sh``) where that build is impossible; each test says which."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_operator.runtime import opmetrics
from ddp_trainer import contract
from helpers.chart_files import ALERTS
from testcluster.images import MONITORING_BUILD, monitoring_bin

REPO = Path(__file__).resolve().parents[2]
OPERATOR_FAMILIES = set(opmetrics.FAMILIES)
"""The operator's families (:mod:`ddp_operator.runtime.opmetrics`)."""


@functools.cache
def tool(name: str) -> str:
    """``promtool`` or ``prometheus``: Prometheus 3's (built), else the one on PATH; prints its version."""
    built = monitoring_bin()
    found = f"{built}/{name}" if built else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: `make test` builds Prometheus 3 ({MONITORING_BUILD})")
    version = subprocess.run([found, "--version"], capture_output=True, text=True)
    print(f"{name}: {found}: {(version.stdout or version.stderr).splitlines()[0]}")
    return found


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def trainer_families() -> set[str]:
    """Every ``ddp_*`` family the contract names."""
    return {
        value for name, value in vars(contract).items() if isinstance(value, str) and value.startswith("ddp_")
    }


def known_sample(name: str) -> bool:
    """Whether a sample name in PromQL is one the trainer or the operator exports."""
    suffixes = ("_total", "_bucket", "_sum", "_count", "")
    families = trainer_families() | OPERATOR_FAMILIES | {"up", "ALERTS"}
    return any(name.removesuffix(suffix) in families for suffix in suffixes if name.endswith(suffix))


def metric_names(promql: str) -> set[str]:
    """The metric names a PromQL expression reads (label matchers and groupings taken out first)."""
    bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", promql)
    bare = re.sub(r"\{[^}]*\}", " ", bare)
    return set(re.findall(r"\b(?:ddp_[a-z_]+|ddpjob_[a-z_]+|up)\b", bare))
