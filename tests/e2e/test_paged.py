"""Paged for real: the chart's monitors and rules under a real Prometheus Operator, on Prometheus 3, and a
divergence delivered by Alertmanager.

The way a user runs it: the Prometheus Operator (a Deployment) reconciles a ``Prometheus`` and an
``Alertmanager`` with kube-prometheus-stack's selectors (monitors and rules labelled ``release:
kube-prometheus-stack``, any namespace); their StatefulSets' pods run Prometheus 3, Alertmanager and the
operator's config reloader, all built from their Go modules (``hack/monitoring/build.sh``). Those three
images are upstream ones this machine cannot pull (it reaches no registry), so their pods run on the node
agents, which run those binaries for the images (``testcluster/images.py``); the chart's operator and the
DDPJob's trainer pods run from the project's images on the real nodes, on the same pod network. The chart
is installed with the README's monitoring values, then a DDPJob runs the divergence drill under ``Warn``.
Proven: Prometheus finds the operator and every trainer pod **through the chart's ServiceMonitor and
PodMonitor** and they are up; every group of the chart's PrometheusRule is loaded and evaluated without
error; every dashboard query returns data; the divergence alert fires and Alertmanager delivers it to a
webhook this test serves on the bridge, naming the job, its namespace and the diverged rank; after the
DDPJob is deleted the alert resolves, and that is delivered too.
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

import pytest
import yaml

from helpers.chart_files import ALERTS, panel_queries
from helpers.e2e import ON_REAL_NODES, REPO, children, real_ddpjob
from helpers.helmrelease import Release, installed, prometheus_operator_crds
from testcluster import netns
from testcluster.fixtures import Cluster, wait_for
from testcluster.images import MONITORING_BUILD, monitoring_bin
from testcluster.nodeconfig import RealNode

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

VERSIONS = dict(
    line.split("=", 1)
    for line in (REPO / "hack" / "monitoring" / "versions.env").read_text().splitlines()
    if "=" in line and not line.startswith("#")
)
PROMETHEUS_IMAGE = f"quay.io/prometheus/prometheus:v{VERSIONS['PROMETHEUS_RELEASE']}"
ALERTMANAGER_IMAGE = f"quay.io/prometheus/alertmanager:{VERSIONS['ALERTMANAGER_VERSION']}"
OPERATOR_VERSION = VERSIONS["PROMETHEUS_OPERATOR_VERSION"]
OPERATOR_IMAGE = f"quay.io/prometheus-operator/prometheus-operator:{OPERATOR_VERSION}"
RELOADER_IMAGE = f"quay.io/prometheus-operator/prometheus-config-reloader:{OPERATOR_VERSION}"
RELEASE_LABEL = {"release": "kube-prometheus-stack"}
# The README's monitoring values (section "Watch it"), as --set-json keys.
README_VALUES: dict[str, Any] = {
    "metrics.podMonitor.enabled": True,
    "metrics.serviceMonitor.enabled": True,
    "prometheusRule.enabled": True,
    "grafanaDashboard.enabled": True,
    "metrics.podMonitor.labels": RELEASE_LABEL,
    "metrics.serviceMonitor.labels": RELEASE_LABEL,
    "prometheusRule.labels": RELEASE_LABEL,
}
# Scraped every 2 s rather than the chart's 15 s / 30 s, so the dashboard's rates fill in seconds (Grafana's
# $__rate_interval, at least 4 scrape intervals, becomes 20s below).
FAST_SCRAPES = {"metrics.podMonitor.interval": "2s", "metrics.serviceMonitor.interval": "2s"}
DIVERGED_RANK = "1"
T = TypeVar("T")


class Webhook:
    """Alertmanager's receiver: an HTTP server on the bridge's address, which pods reach."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                webhook.received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((netns.BRIDGE_IP, 0), Handler)
        self.url = f"http://{netns.BRIDGE_IP}:{self.server.server_address[1]}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def divergence(self, status: str, job: str) -> list[dict[str, Any]]:
        """The ``DDPJobDivergenceDetected`` alerts of DDPJob ``job`` delivered with ``status``."""
        return [
            alert
            for message in self.received
            for alert in message["alerts"]
            if alert["status"] == status
            and alert["labels"].get("alertname") == "DDPJobDivergenceDetected"
            and alert["labels"].get("ddpjob") == job
        ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Stack:
    cluster: Cluster
    namespace: str
    webhook: Webhook
    prometheus_ip: str = ""

    def pod_ip(self, selector: str) -> str:
        def running() -> str | None:
            pods = self.cluster.kubectl_json("get", "pods", "-n", self.namespace, "-l", selector)["items"]
            live = [p for p in pods if p["status"].get("phase") == "Running" and p["status"].get("podIP")]
            return str(live[0]["status"]["podIP"]) if live else None

        return wait_for(running, what=f"a Running pod {selector} in {self.namespace}", timeout=180, every=1)

    def prometheus(self, path: str) -> Any:
        """GET from Prometheus's API; the operator may roll its pod (a new IP), so it is looked up again
        after a failure, and a wait that calls this retries."""
        if not self.prometheus_ip:
            self.prometheus_ip = self.pod_ip("app.kubernetes.io/name=prometheus")
        try:
            with urllib.request.urlopen(f"http://{self.prometheus_ip}:9090{path}", timeout=10) as response:
                return json.loads(response.read())
        except OSError:
            self.prometheus_ip = ""
            raise

    def query(self, promql: str) -> list[dict[str, Any]]:
        answer = self.prometheus("/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        assert answer["status"] == "success", (promql, answer)
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def logs(self) -> str:
        out = []
        for pod in self.cluster.kubectl_json("get", "pods", "-n", self.namespace)["items"]:
            for container in pod["spec"]["containers"]:
                name = pod["metadata"]["name"]
                args = ("logs", "-n", self.namespace, name, "-c", container["name"])
                text = self.cluster.kubectl(*args, check=False).stdout
                out.append(f"--- {name}/{container['name']}\n{text[-3000:]}")
        return "\n".join(out)


def _or_none(read: Callable[[], T | None]) -> Callable[[], T | None]:
    """``read`` for a wait: a connection that fails (the pod rolled) is "not yet"."""

    def tolerant() -> T | None:
        try:
            return read()
        except OSError:
            return None

    return tolerant


def _apply(cluster: Cluster, *docs: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))


def _stack_objects(ns: str, webhook_url: str) -> list[dict[str, Any]]:
    """kube-prometheus-stack's parts, trimmed to what the test needs."""
    operator_labels = {"app.kubernetes.io/name": "prometheus-operator"}
    alertmanager_config = {
        "route": {
            "receiver": "ddpjob-test",
            "group_by": ["alertname", "ddpjob_namespace", "ddpjob"],
            "group_wait": "1s",
            "group_interval": "2s",
            "repeat_interval": "1h",
        },
        "receivers": [
            {"name": "ddpjob-test", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}
        ],
    }
    reader_rules = [
        {
            "apiGroups": [""],
            "resources": ["pods", "services", "endpoints"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        },
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]},
    ]
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "prometheus-operator", "namespace": ns},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{ns}-prometheus-operator"},
            # the upstream ClusterRole is long; the test cluster's RBAC is not what is proven here
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus-operator", "namespace": ns}],
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "prometheus-operator", "namespace": ns, "labels": operator_labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": operator_labels},
                "template": {
                    "metadata": {"labels": operator_labels},
                    "spec": {
                        "serviceAccountName": "prometheus-operator",
                        "containers": [
                            {
                                "name": "prometheus-operator",
                                "image": OPERATOR_IMAGE,
                                "args": [
                                    f"--prometheus-config-reloader={RELOADER_IMAGE}",
                                    "--log-level=info",
                                ],
                            }
                        ],
                    },
                },
            },
        },
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "prometheus", "namespace": ns}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"{ns}-prometheus"},
            "rules": reader_rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{ns}-prometheus"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"{ns}-prometheus",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": ns}],
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "alertmanager-main", "namespace": ns},
            "stringData": {"alertmanager.yaml": yaml.safe_dump(alertmanager_config)},
        },
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "Alertmanager",
            "metadata": {"name": "main", "namespace": ns},
            "spec": {"replicas": 1, "image": ALERTMANAGER_IMAGE, "version": VERSIONS["ALERTMANAGER_VERSION"]},
        },
    ]


def _prometheus(ns: str) -> dict[str, Any]:
    """kube-prometheus-stack's Prometheus: monitors and rules labelled with its release, in any namespace.
    Created after the chart: the node agent writes a pod's Secret and ConfigMap volumes when it starts
    (a kubelet refreshes them), so the operator's first config must already hold the chart's monitors."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "Prometheus",
        "metadata": {"name": "k8s", "namespace": ns},
        "spec": {
            "replicas": 1,
            "image": PROMETHEUS_IMAGE,
            "version": f"v{VERSIONS['PROMETHEUS_RELEASE']}",
            "serviceAccountName": "prometheus",
            "scrapeInterval": "2s",
            "evaluationInterval": "2s",
            # kube-prometheus-stack's: monitors and rules of its release, in any namespace
            "serviceMonitorSelector": {"matchLabels": RELEASE_LABEL},
            "serviceMonitorNamespaceSelector": {},
            "podMonitorSelector": {"matchLabels": RELEASE_LABEL},
            "podMonitorNamespaceSelector": {},
            "ruleSelector": {"matchLabels": RELEASE_LABEL},
            "ruleNamespaceSelector": {},
            "alerting": {
                "alertmanagers": [
                    {"namespace": ns, "name": "alertmanager-operated", "port": "web", "apiVersion": "v2"}
                ]
            },
        },
    }


@pytest.fixture(scope="module")
def stack(cluster: Cluster) -> Iterator[Stack]:
    if not monitoring_bin():
        pytest.fail(f"the monitoring stack is not built: `make test` builds it first ({MONITORING_BUILD})")
    files = prometheus_operator_crds(every_kind=True)
    names = [f"{path.stem}.monitoring.coreos.com" for path in files]  # (PyYAML cannot read all of them)
    # another test may have deleted these CRDs a moment ago: wait until they are gone before re-creating
    cluster.kubectl("wait", "--for=delete", *[f"crd/{n}" for n in names], "--timeout=120s", check=False)
    for path in files:
        cluster.kubectl("apply", "--server-side", "-f", str(path))
    cluster.wait_established(*[f"crd/{n}" for n in names])
    ns = cluster.create_namespace("mon")
    webhook = Webhook()
    stack = Stack(cluster, ns, webhook)
    try:
        _apply(cluster, *_stack_objects(ns, webhook.url))
        stack.pod_ip("app.kubernetes.io/name=alertmanager")
        yield stack
    finally:
        print(stack.logs()[-12000:])
        cluster.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False)
        cluster.kubectl(
            "delete", "clusterrolebinding", f"{ns}-prometheus-operator", f"{ns}-prometheus", check=False
        )
        cluster.kubectl("delete", "clusterrole", f"{ns}-prometheus", check=False)
        cluster.kubectl("delete", "crd", *names, "--wait=false", check=False)
        webhook.close()


def test_a_divergence_is_scraped_through_the_charts_monitors_and_paged_through_alertmanager(
    cluster: Cluster, stack: Stack, real_nodes: list[RealNode]
) -> None:
    with installed(cluster, "paged", **README_VALUES, **FAST_SCRAPES, **ON_REAL_NODES) as release:
        _apply(cluster, _prometheus(stack.namespace))
        _paged(cluster, stack, release)


def _paged(cluster: Cluster, stack: Stack, release: Release) -> None:
    ns = release.jobs
    job = real_ddpjob(
        "drill",
        trainer={"steps": 200000, "checkpointEvery": 0},
        syncCheck={"everySteps": 20, "onDivergence": "Warn"},
        env=[{"name": "DDPJOB_CHAOS_DIVERGE", "value": f"rank={DIVERGED_RANK},step=60"}],
    )
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(job))

    def both_running() -> list[dict[str, Any]] | None:
        pods = children(cluster, ns, "pods", "drill")
        running = len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods)
        return pods if running else None

    pods = wait_for(both_running, what="both trainer pods of DDPJob drill to run", timeout=180, every=1)
    pod_names = {p["metadata"]["name"] for p in pods}

    # 1. Targets: the operator through the chart's ServiceMonitor, every trainer pod through its PodMonitor.
    def targets_up() -> dict[str, list[dict[str, Any]]] | None:
        active = stack.prometheus("/api/v1/targets?state=active")["data"]["activeTargets"]
        pools: dict[str, list[dict[str, Any]]] = {}
        for target in active:
            pools.setdefault(target["scrapePool"].split("/")[0], []).append(target)
        trainers = [
            t
            for t in pools.get("podMonitor", [])
            if t["labels"].get("pod") in pod_names and t["health"] == "up"
        ]
        operators = [
            t
            for t in pools.get("serviceMonitor", [])
            if t["labels"].get("namespace") == release.namespace and t["health"] == "up"
        ]
        return pools if len(trainers) == len(pod_names) and operators else None

    try:
        pools = wait_for(
            _or_none(targets_up),
            what="the operator and every trainer pod up in Prometheus",
            timeout=180,
            every=2,
        )
    except AssertionError:
        print(json.dumps(stack.prometheus("/api/v1/targets")["data"], indent=1)[-6000:])
        raise
    scrape_pools = {t["scrapePool"] for pool in pools.values() for t in pool}
    print(f"scrape pools: {sorted(scrape_pools)}")
    assert any(p.startswith(f"podMonitor/{release.namespace}/") for p in scrape_pools), scrape_pools
    assert any(p.startswith(f"serviceMonitor/{release.namespace}/") for p in scrape_pools), scrape_pools
    build = stack.prometheus("/api/v1/status/buildinfo")["data"]
    assert build["version"] == VERSIONS["PROMETHEUS_RELEASE"], build
    print(f"Prometheus {build['version']}")

    # 2. Rules: every group of the chart's PrometheusRule loaded and evaluated without error.
    wanted = {g["name"]: len(g["rules"]) for g in yaml.safe_load(ALERTS.read_text())["groups"]}

    def rules_evaluated() -> list[dict[str, Any]] | None:
        groups = stack.prometheus("/api/v1/rules")["data"]["groups"]
        ours = [g for g in groups if g["name"] in wanted]
        done = len(ours) == len(wanted) and all(g["lastEvaluation"][:4] != "0001" for g in ours)
        return ours if done else None

    groups = wait_for(
        _or_none(rules_evaluated), what="the chart's rule groups loaded and evaluated", timeout=120, every=2
    )
    assert {g["name"]: len(g["rules"]) for g in groups} == wanted
    errors = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"] if r["health"] != "ok"]
    assert not errors, errors

    # 3. The dashboard: every query returns data on Prometheus 3.
    wait_for(
        _or_none(
            lambda: len(stack.query(f'ddp_steps_total{{ddpjob="drill",ddpjob_namespace="{ns}"}} > 40')) == 2
        ),
        what="both ranks' steps scraped",
        timeout=120,
        every=2,
    )

    def empty_panels() -> list[tuple[str, str]]:
        empty = []
        for title, expr in panel_queries():
            result = stack.query(expr)
            if not result or all(math.isnan(float(r["value"][1])) for r in result):
                empty.append((title, expr))
        return empty

    # rate() needs samples that differ inside its window: a panel may take a few scrapes to fill in (the
    # operator's reconcile-time quantile is NaN until a reconcile lands between two of its scrapes)
    deadline = time.monotonic() + 60
    while (empty := empty_panels()) and time.monotonic() < deadline:
        time.sleep(2)
    assert not empty, f"dashboard panels with no data on Prometheus {VERSIONS['PROMETHEUS_RELEASE']}: {empty}"

    # 4. The divergence alert fires, and Alertmanager delivers it naming the job, namespace and diverged rank.
    def delivered() -> list[dict[str, Any]] | None:
        found = stack.webhook.divergence("firing", "drill")
        # the diverged rank's own alert: its pod's scrape holds its mismatch and its ddp_sync_rank_diverged
        return found if any(a["labels"].get("rank") == DIVERGED_RANK for a in found) else None

    try:
        firing = wait_for(
            delivered,
            what=f"DDPJobDivergenceDetected of rank {DIVERGED_RANK} delivered to the webhook",
            timeout=180,
            every=1,
        )
    except AssertionError:
        print(stack.query("ALERTS"), stack.webhook.received)
        raise
    print(f"delivered: {json.dumps(firing, indent=1)[:3000]}")
    assert all(a["labels"]["ddpjob_namespace"] == ns for a in firing), firing
    assert all(a["labels"]["severity"] == "critical" for a in firing), firing
    # The diverged rank's alert always names it. Another rank's alert may be evaluated before the diverged
    # rank's pod was scraped after the check, and then names no rank yet (never a wrong one).
    own = [a for a in firing if a["labels"]["rank"] == DIVERGED_RANK]
    assert all(a["annotations"].get("diverged_ranks") == DIVERGED_RANK for a in own), own
    named = {a["annotations"].get("diverged_ranks", "") for a in firing}
    assert named <= {DIVERGED_RANK, ""}, f"diverged_ranks should name rank {DIVERGED_RANK} alone: {named}"

    # 5. The job deleted: its series go stale, the alert resolves, and the resolution is delivered.
    cluster.kubectl("delete", "ddpjob", "drill", "-n", ns, "--wait=true", "--timeout=120s")

    wait_for(
        lambda: stack.webhook.divergence("resolved", "drill"),
        what="the resolved DDPJobDivergenceDetected delivered",
        timeout=240,
        every=2,
    )
