"""A real Prometheus scrapes a real training run (torchrun, 2 "pods" x 1 process, gloo on loopback) and
the operator's metrics module (:mod:`ddp_operator.runtime.opmetrics` in a process of its own that records a
reconcile every half second: no cluster here), with the chart's alert rules loaded: every dashboard
panel's query returns data, a healthy run raises no alert (not even pending), and the fire drill
(``DDPJOB_CHAOS_DIVERGE`` under ``--on-divergence=Warn``) fires DDPJobDivergenceDetected. Default scrape
settings (``honor_labels: false``): the trainer's labels must survive them."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.chart_files import ALERTS, panel_queries
from helpers.monitoring import REPO, tool

sys.path.insert(0, str(REPO / "tests" / "trainer"))
from helpers.torchrun_helpers import Launch, free_port, launch

pytestmark = pytest.mark.slow

TRAINER = ["--module", "ddp_trainer", "--device=cpu", "--backend=gloo", "--seed=7", "--batch-size=16"]
RUN = [*TRAINER, "--model=slow_factories:slow_mlp", "--sync-every=20", "--timeout-seconds=120"]
TRAINER_JOB, OPERATOR_JOB = "ddpjob-trainer", "ddpjob-operator"
OPERATOR_STUB = """
import sys, time
from ddp_operator.runtime import opmetrics
opmetrics.serve(int(sys.argv[1]))
# the DDPJobs of this module's runs, as the operator's index would hold them (ddpjob_job_info: the
# divergence alert fires only for a job the operator, when it is scraped, still lists)
JOBS = {"testns": [
    {"metadata": {"namespace": "testns", "name": name}, "status": {"phase": "Running"}}
    for name in ("healthy", "drill", "sdc")
]}
opmetrics.WATCHED.watch(JOBS)
while True:  # a reconcile every half second, as the operator's timers do with a few DDPJobs
    opmetrics.observe_reconcile("ok", 0.02)
    time.sleep(0.5)
"""


class Prometheus:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.targets = workdir / "targets.json"
        self.targets.write_text("[]")
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [
                {
                    "job_name": TRAINER_JOB,
                    "file_sd_configs": [{"files": [str(self.targets)], "refresh_interval": "1s"}],
                },
                {"job_name": OPERATOR_JOB, "static_configs": [{"targets": []}]},
            ],
        }
        self.operator_port = free_port()
        config["scrape_configs"][1]["static_configs"][0]["targets"] = [f"127.0.0.1:{self.operator_port}"]
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = workdir / "prometheus.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    tool("prometheus"),
                    f"--config.file={workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.wait(lambda: self.get("/-/ready") is not None, 30, "ready")

    def get(self, path: str) -> Any:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as response:
                body = response.read().decode()
        except OSError:
            return None
        return json.loads(body) if path.startswith("/api/") else body

    def query(self, promql: str) -> list[dict[str, Any]]:
        answer = self.get("/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        assert answer and answer["status"] == "success", (promql, answer)
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def scrape(self, run: Launch) -> None:
        targets = [f"127.0.0.1:{node.metrics_port}" for node in run.nodes]
        self.targets.write_text(json.dumps([{"targets": targets}]))

    def wait(self, ready: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited:\n{self.log.read_text()[-4000:]}")
            if ready():
                return
            time.sleep(0.5)
        raise AssertionError(f"prometheus: not {what} in {timeout}s:\n{self.log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    work = tmp_path_factory.mktemp("prometheus")
    server = Prometheus(work)
    operator = subprocess.Popen([sys.executable, "-c", OPERATOR_STUB, str(server.operator_port)])
    try:
        yield server
    finally:
        operator.kill()
        server.proc.terminate()
        server.proc.wait(30)
        operator.wait()


def test_dashboard_has_data_and_a_healthy_run_raises_no_alert(prometheus: Prometheus, tmp_path: Path) -> None:
    run = launch(tmp_path, [*RUN, "--steps=600"], nnodes=2, nproc=1, env={"DDPJOB_NAME": "healthy"})
    try:
        prometheus.scrape(run)
        # both pods scraped
        prometheus.wait(
            lambda: (
                len(prometheus.query(f'ddp_steps_total{{ddpjob="healthy",job="{TRAINER_JOB}"}} > 40')) == 2
            ),
            90,
            "scraping both ranks",
        )

        def gaps() -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[str]]:
            """The panels with no data and those with only NaN, and a line per panel (its series)."""
            empty, nan, said = [], [], []
            for title, expr in panel_queries():
                result = prometheus.query(expr)
                said.append(f"{len(result):3d} series: {title}")
                if not result:
                    empty.append((title, expr))
                elif all(math.isnan(float(r["value"][1])) for r in result):
                    nan.append((title, expr))
            return empty, nan, said

        # a panel fills in once rate() has samples that differ inside its window and the sync-check
        # histogram a check (a scrape a second): wait for every one, not a fixed time
        deadline = time.monotonic() + 60
        while ((found := gaps())[0] or found[1]) and run.running() and time.monotonic() < deadline:
            time.sleep(1)
        empty, nan, said = found
        print("\n".join(said))
        assert run.running(), run.logs()
        assert not empty, f"panels with no data after 60 s: {empty}"
        assert not nan, f"panels with only NaN after 60 s: {nan}"
        # the trainer's labels survived the default scrape settings; Prometheus's own are there too
        steps = prometheus.query('ddp_steps_total{ddpjob="healthy"}')
        assert {(s["metric"]["ddpjob_namespace"], s["metric"]["job"]) for s in steps} == {
            ("testns", TRAINER_JOB)
        }
        assert {s["metric"]["rank"] for s in steps} == {"0", "1"}
        assert not prometheus.query('{__name__=~"ddp_.+", exported_job!=""}')
        assert not prometheus.query('{__name__=~"ddpjob_.+", exported_namespace!=""}')
        # every check kind x result exists, the mismatches at 0
        mismatches = prometheus.query('ddp_sync_checks_total{ddpjob="healthy",result="mismatch"}')
        assert len(mismatches) == 2 * 4 and all(float(m["value"][1]) == 0 for m in mismatches)
        # the slowest rank is named
        slowest = prometheus.query(
            'topk by (ddpjob) (1, rate(ddp_step_duration_seconds_sum{ddpjob="healthy"}[20s])'
            ' / rate(ddp_step_duration_seconds_count{ddpjob="healthy"}[20s]))'
        )
        assert len(slowest) == 1 and slowest[0]["metric"]["rank"] in ("0", "1")
        # the rules are loaded and evaluated, and nothing is firing or even pending
        rules = prometheus.get("/api/v1/rules")["data"]["groups"]
        wanted = sum(len(group["rules"]) for group in yaml.safe_load(ALERTS.read_text())["groups"])
        assert sum(len(group["rules"]) for group in rules) == wanted >= 11
        assert all(rule["health"] == "ok" for group in rules for rule in group["rules"]), rules
        assert run.running(), "the run ended before the checks: make it longer"
        assert prometheus.query("ALERTS") == []
    finally:
        run.kill()


def test_fire_drill_fires_the_divergence_alert(prometheus: Prometheus, tmp_path: Path) -> None:
    env = {"DDPJOB_NAME": "drill", "DDPJOB_CHAOS_DIVERGE": "rank=1,step=30"}
    run = launch(tmp_path, [*RUN, "--steps=600", "--on-divergence=Warn"], nnodes=2, nproc=1, env=env)
    try:
        prometheus.scrape(run)
        query = 'ALERTS{alertname="DDPJobDivergenceDetected",alertstate="firing",ddpjob="drill"}'
        prometheus.wait(lambda: prometheus.query(query), 90, "firing DDPJobDivergenceDetected")
        alerts = prometheus.query(query)
        assert {a["metric"]["rank"] for a in alerts} <= {"0", "1"}
        assert all(a["metric"]["severity"] == "critical" for a in alerts)
        assert run.running(), "Warn keeps training"
        firing = prometheus.query('ALERTS{alertstate="firing"}')
        assert {a["metric"]["alertname"] for a in firing} == {"DDPJobDivergenceDetected"}
        print(f"\nfiring after the drill: {[a['metric'] for a in firing]}")
    finally:
        run.kill()


def test_sdc_drill_fires_the_faulty_rank_alert_naming_the_node(
    prometheus: Prometheus, tmp_path: Path
) -> None:
    """DDPJOB_CHAOS_SDC on rank 3 of 2 x 2 (a majority needs 3 ranks or more), onFaultyRank Warn: the sync
    check sees nothing, the probe names rank 3, and the alert carries its node."""
    env = {
        "DDPJOB_NAME": "sdc",
        "DDPJOB_CHAOS_SDC": "rank=3,step=10",
        "DDPJOB_PROBE_EVERY": "20",
        "DDPJOB_ON_FAULTY_RANK": "Warn",
    }
    per_node = [{"DDPJOB_NODE_NAME": f"node-{k}"} for k in range(2)]
    run = launch(tmp_path, [*RUN, "--steps=2000"], nnodes=2, nproc=2, env=env, per_node=per_node)
    try:
        prometheus.scrape(run)
        query = 'ALERTS{alertname="DDPJobFaultyRank",alertstate="firing",ddpjob="sdc"}'
        prometheus.wait(lambda: prometheus.query(query), 120, "firing DDPJobFaultyRank")
        (alert,) = prometheus.query(query)
        assert (alert["metric"]["rank"], alert["metric"]["node"]) == ("3", "node-1")
        assert not prometheus.query('ALERTS{alertname="DDPJobDivergenceDetected",ddpjob="sdc"}')
        assert run.running(), "Warn keeps training"
    finally:
        run.kill()
