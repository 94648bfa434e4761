"""Generate the Grafana dashboard of a DDPJob: ``charts/ddpjob-operator/files/dashboard.json``.

One screen for "is my job healthy": the sync verdict and checks, mismatched tensors and divergence,
repairs, step time p50/p99 per rank with the slowest rank named, skew, throughput beside the world size
(an elastic job's nodes now and desired), loss, restarts, last-step age, and the operator's reconcile
health. Grafana's JSON model (schemaVersion 39), built here as plain data from the contract's metric
names (Grafana's Python SDK would add a dependency for the same JSON).
Variables: ``datasource`` (any Prometheus), ``namespace`` and ``job`` (the trainer's ``ddpjob_namespace``
and ``ddpjob`` labels, multi-select).

    python hack/dashboard.py            # rewrite the file
    python hack/dashboard.py --check    # exit 1 when the file is not what this script writes
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ddp_trainer import contract as c

OUT = Path(__file__).resolve().parents[1] / "charts" / "ddpjob-operator" / "files" / "dashboard.json"
UID = "ddpjob-health"
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = f'{c.NAMESPACE_LABEL}=~"$namespace", {c.JOB_LABEL}=~"$job"'
BY_JOB = f"{c.NAMESPACE_LABEL}, {c.JOB_LABEL}"
RATE = "$__rate_interval"
OPERATOR = 'job="ddpjob-operator"'


def total(family: str) -> str:
    return c.counter_sample(family)


def mean_step_time() -> str:
    d = c.STEP_DURATION
    return f"rate({d}_sum{{{SEL}}}[{RATE}]) / rate({d}_count{{{SEL}}}[{RATE}])"


def quantile(q: float, metric: str, by: str, selector: str = SEL) -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{{{selector}}}[{RATE}])))"


def world(elastic: str) -> str:
    """An elastic job's size as the operator says it (``elastic``: nodes now, or desired), else the nodes
    whose ranks report (a rigid job's world: its nodes, training or not there)."""
    nodes = f"count by ({BY_JOB}) (count by ({BY_JOB}, {c.NODE_RANK_LABEL}) ({c.INFO}{{{SEL}}}))"
    return f"max by ({BY_JOB}) ({elastic}{{{SEL}}}) or {nodes}"


# A panel: (title, kind, unit, width, height, [(expr, legend)], extra fieldConfig defaults)
Panel = tuple[str, str, str, int, int, list[tuple[str, str]], dict[str, Any]]
VERDICT = {
    "mappings": [
        {"type": "value", "options": {"1": {"text": "In sync", "color": "green", "index": 0}}},
        {"type": "value", "options": {"0": {"text": "DIVERGED", "color": "red", "index": 1}}},
    ],
    "color": {"mode": "thresholds"},
    "thresholds": {
        "mode": "absolute",
        "steps": [{"color": "red", "value": None}, {"color": "green", "value": 1}],
    },
}
UP = {
    "mappings": [
        {"type": "value", "options": {"1": {"text": "Up", "color": "green", "index": 0}}},
        {"type": "value", "options": {"0": {"text": "DOWN", "color": "red", "index": 1}}},
    ],
    "color": {"mode": "thresholds"},
    "thresholds": VERDICT["thresholds"],
}
ZERO_IS_GOOD = {
    "color": {"mode": "thresholds"},
    "thresholds": {
        "mode": "absolute",
        "steps": [{"color": "green", "value": None}, {"color": "red", "value": 1}],
    },
}
JOB = "{{ddpjob}}"
PER_RANK = "{{ddpjob}} rank {{rank}}"
FAULTY = {
    "mappings": [
        {"type": "value", "options": {"0": {"text": "OK", "color": "green", "index": 0}}},
        {"type": "value", "options": {"1": {"text": "FAULTY", "color": "red", "index": 1}}},
    ],
    **ZERO_IS_GOOD,
}
WHERE = "{{ddpjob}} rank {{rank}} on {{node}}"


def p(
    title: str, kind: str, unit: str, size: tuple[int, int], *queries: tuple[str, str], **extra: Any
) -> Panel:
    return (title, kind, unit, size[0], size[1], list(queries), extra.get("defaults", {}))


def per_job(agg: str, metric: str) -> str:
    return f"{agg} by ({BY_JOB}) ({metric}{{{SEL}}})"


ROWS: list[tuple[str, list[Panel]]] = [
    (
        "Sync health",
        [
            p(
                "Last sync check",
                "stat",
                "none",
                (4, 5),
                (per_job("min", c.SYNC_LAST_CHECK_OK), JOB),
                defaults=VERDICT,
            ),
            p(
                "Since the last passing check",
                "stat",
                "s",
                (4, 5),
                (f"time() - {per_job('max', c.SYNC_LAST_SUCCESS_TIMESTAMP)}", JOB),
            ),
            p(
                "Sync checks by result",
                "stat",
                "short",
                (4, 5),
                (
                    f"max by ({BY_JOB}, result) (sum by ({BY_JOB}, rank, result) "
                    f"({total(c.SYNC_CHECKS)}{{{SEL}}}))",
                    "{{ddpjob}} {{result}}",
                ),
            ),
            p(
                "Mismatched tensors",
                "stat",
                "short",
                (3, 5),
                (per_job("max", c.SYNC_MISMATCHED_TENSORS), JOB),
                defaults=ZERO_IS_GOOD,
            ),
            p("Max divergence", "stat", "none", (3, 5), (per_job("max", c.SYNC_MAX_ABS_DIVERGENCE), JOB)),
            p(
                "Repairs",
                "stat",
                "short",
                (3, 5),
                (per_job("max", total(c.SYNC_REPAIRS)), JOB),
                defaults=ZERO_IS_GOOD,
            ),
            p(
                "Sync check time p99",
                "stat",
                "s",
                (3, 5),
                (quantile(0.99, c.SYNC_CHECK_DURATION, BY_JOB), JOB),
            ),
        ],
    ),
    (
        "Compute probe (a rank whose arithmetic differs from its peers')",
        [
            p(
                "Faulty rank, by node",
                "stat",
                "none",
                (9, 5),
                (f"max by ({BY_JOB}, rank, node) ({c.PROBE_FAULTY}{{{SEL}}})", WHERE),
                defaults=FAULTY,
            ),
            p(
                "Flaky rank, by node",
                "stat",
                "none",
                (9, 5),
                (f"max by ({BY_JOB}, rank, node) ({c.PROBE_FLAKY}{{{SEL}}})", WHERE),
                defaults=ZERO_IS_GOOD,
            ),
            p(
                "Probes by result",
                "stat",
                "short",
                (6, 5),
                (
                    f"max by ({BY_JOB}, result) ({total(c.PROBES)}{{{SEL}}})",
                    "{{ddpjob}} {{result}}",
                ),
            ),
        ],
    ),
    (
        "Training",
        [
            p(
                "Step time p50 / p99 per rank",
                "timeseries",
                "s",
                (12, 8),
                (quantile(0.5, c.STEP_DURATION, f"{BY_JOB}, rank"), PER_RANK + " p50"),
                (quantile(0.99, c.STEP_DURATION, f"{BY_JOB}, rank"), PER_RANK + " p99"),
            ),
            p(
                "Slowest rank (mean step time)",
                "stat",
                "s",
                (6, 8),
                (f"topk by ({BY_JOB}) (1, {mean_step_time()})", "{{ddpjob}}: rank {{rank}}"),
            ),
            p(
                "Step time skew",
                "timeseries",
                "percentunit",
                (6, 8),
                (per_job("max", c.STEP_TIME_SKEW), JOB),
                defaults={"min": 0, "max": 1},
            ),
            p(
                "Throughput",
                "timeseries",
                "suffix: samples/s",
                (8, 8),
                (f"sum by ({BY_JOB}) (rate({total(c.SAMPLES)}{{{SEL}}}[{RATE}]))", JOB),
            ),
            p(
                "World size (nodes)",
                "timeseries",
                "short",
                (8, 8),
                (world("ddpjob_elastic_nodes"), "{{ddpjob}}: training"),
                (world("ddpjob_elastic_desired_nodes"), "{{ddpjob}}: desired"),
            ),
            p("Loss per rank", "timeseries", "none", (8, 8), (f"{c.LOSS}{{{SEL}}}", PER_RANK)),
            p(
                "Step per rank",
                "timeseries",
                "none",
                (8, 8),
                (f"max by ({BY_JOB}, rank) ({c.STEP}{{{SEL}}})", PER_RANK),
            ),
            p(
                "Last step age per rank",
                "timeseries",
                "s",
                (8, 8),
                (f"time() - {c.LAST_STEP_TIMESTAMP}{{{SEL}}}", PER_RANK),
            ),
            p("Restarts", "stat", "short", (8, 8), (per_job("max", c.RESTARTS), JOB)),
            p(
                "Non-finite loss steps",
                "stat",
                "short",
                (8, 8),
                (per_job("sum", total(c.NONFINITE_LOSS_STEPS)), JOB),
                defaults=ZERO_IS_GOOD,
            ),
        ],
    ),
    (
        "Operator",
        [
            p("Operator up", "stat", "none", (4, 6), (f"up{{{OPERATOR}}}", "{{instance}}"), defaults=UP),
            p(
                "Reconciles by result",
                "timeseries",
                "ops",
                (8, 6),
                (f"sum by (result) (rate(ddpjob_reconciles_total{{{OPERATOR}}}[{RATE}]))", "{{result}}"),
            ),
            p(
                "Reconcile time p99",
                "timeseries",
                "s",
                (6, 6),
                (quantile(0.99, "ddpjob_reconcile_duration_seconds", "instance", OPERATOR), "{{instance}}"),
            ),
            p(
                "DDPJobs by phase",
                "stat",
                "short",
                (6, 6),
                (f"sum by (phase) (ddpjob_jobs{{{OPERATOR}}})", "{{phase}}"),
            ),
        ],
    ),
]


def panel(pid: int, spec: Panel, x: int, y: int) -> dict[str, Any]:
    title, kind, unit, w, h, queries, extra = spec
    out: dict[str, Any] = {
        "id": pid,
        "type": kind,
        "title": title,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit, **extra}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(queries)
        ],
    }
    if kind == "stat":
        out["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "textMode": "value_and_name"}
    else:
        out["options"] = {"legend": {"displayMode": "table", "placement": "right", "showLegend": True}}
    return out


def variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def build() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y = 0
    for title, specs in ROWS:
        row = {"id": len(panels) + 1, "type": "row", "title": title, "collapsed": False, "panels": []}
        panels.append({**row, "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}})
        y += 1
        x, row_h = 0, 0
        for spec in specs:
            if x + spec[3] > 24:
                x, y = 0, y + row_h
                row_h = 0
            panels.append(panel(len(panels) + 1, spec, x, y))
            x, row_h = x + spec[3], max(row_h, spec[4])
        y += row_h
    return {
        "uid": UID,
        "title": "DDPJob: is my job healthy?",
        "description": "Generated by hack/dashboard.py from the ddpjob contract's metric names; do not edit.",
        "tags": ["ddpjob", "pytorch", "ddp"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "",
        "links": [],
        "annotations": {"list": []},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                variable("namespace", "Namespace", f"label_values({c.INFO}, {c.NAMESPACE_LABEL})"),
                variable(
                    "job",
                    "DDPJob",
                    f'label_values({c.INFO}{{{c.NAMESPACE_LABEL}=~"$namespace"}}, {c.JOB_LABEL})',
                ),
            ]
        },
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=False) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the committed file is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run `python hack/dashboard.py`", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
