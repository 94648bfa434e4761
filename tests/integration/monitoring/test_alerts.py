"""The alert rules (charts/ddpjob-operator/files/alerts.yaml): promtool checks and unit-tests them, each
names the job and rank it is about, and each reads only series the trainer or the operator exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from helpers.chart_files import ALERTS
from helpers.monitoring import alert_rules, known_sample, metric_names, tool

HERE = Path(__file__).parent


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run([tool("promtool"), "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in done.stdout


def test_promtool_unit_tests_fire_and_stay_quiet(tmp_path: Path) -> None:
    """alerts_test.yaml: every alert once firing, once not. promtool compares annotations too, so the
    rules run there without theirs (their templates are checked by `promtool check rules` and below)."""
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations")
    (tmp_path / "alerts.yaml").write_text(yaml.safe_dump(rules))
    shutil.copy(HERE / "alerts_test.yaml", tmp_path)
    done = subprocess.run(
        [tool("promtool"), "test", "rules", "alerts_test.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    tests = yaml.safe_load((HERE / "alerts_test.yaml").read_text())["tests"]
    fired = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case["exp_alerts"]}
    assert fired == {rule["alert"] for rule in alert_rules()}


def test_alerts_name_the_job_and_rank_and_say_what_to_do() -> None:
    for rule in alert_rules():
        summary, description = rule["annotations"]["summary"], rule["annotations"]["description"]
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert "Runbook:" in description, rule["alert"]
        if rule["alert"].startswith("DDPJobOperator"):
            assert "$labels.instance" in summary, rule["alert"]
            continue
        for label in ("ddpjob_namespace", "ddpjob"):
            assert f"$labels.{label} " in summary and f"$labels.{label} " in description, rule["alert"]
        if "by (ddpjob_namespace, ddpjob)" not in rule["expr"].split("\n")[0] or "topk" in rule["expr"]:
            assert "$labels.rank" in summary, rule["alert"]


def test_rules_read_only_exported_series() -> None:
    for rule in alert_rules():
        names = metric_names(rule["expr"])
        assert names and all(known_sample(name) for name in names), (rule["alert"], names)
        assert not re.search(r"\b(exported_job|exported_namespace)\b", rule["expr"])
