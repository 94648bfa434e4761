"""The chart's monitoring files (alert rules, dashboard), and the dashboard's queries as a test runs them
against a real Prometheus. A plain module, so tests outside this folder (``tests/e2e/test_paged.py``) read
the same ones."""

from __future__ import annotations

import json
from pathlib import Path

FILES = Path(__file__).resolve().parents[2] / "charts" / "ddpjob-operator" / "files"
ALERTS = FILES / "alerts.yaml"
DASHBOARD = FILES / "dashboard.json"


def panel_queries(rate_interval: str = "20s") -> list[tuple[str, str]]:
    """Every (panel title, PromQL) of the dashboard, with Grafana's variables widened to every job and
    ``$__rate_interval`` set to ``rate_interval`` (Grafana makes it at least four scrape intervals)."""
    dashboard = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$namespace", ".*").replace("$job", ".*")
            out.append((panel["title"], expr.replace("$__rate_interval", rate_interval)))
    return out
