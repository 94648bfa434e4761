"""The chart installed with the real `helm` on the test control plane, and what the tests read about it:
the release's objects, its operator pod (from the operator image, on a real node when the values place it
there), and the API server's audit log of the requests its ServiceAccount made."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testcluster.fixtures import Cluster, wait_for

from .e2e import REPO, session_operator_paused

HELM = Path(sys.executable).with_name("helm")
CHART = REPO / "charts" / "ddpjob-operator"
# What a release may leave behind (helm never deletes the CRDs of a chart's crds/ folder).
CRDS = ("ddpjobs.ddpjob.io", "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev")
# Every kind the chart can render, namespaced or not, for the "nothing left" check.
NAMESPACED_KINDS = (
    "deployments",
    "replicasets",
    "pods",
    "services",
    "configmaps",
    "serviceaccounts",
    "roles",
    "rolebindings",
    "kopfpeerings.kopf.dev",
    "servicemonitors.monitoring.coreos.com",
    "podmonitors.monitoring.coreos.com",
    "prometheusrules.monitoring.coreos.com",
)
CLUSTER_KINDS = ("clusterroles", "clusterrolebindings", "clusterkopfpeerings.kopf.dev")


@contextlib.contextmanager
def installed(
    cluster: Cluster,
    prefix: str,
    *,
    pod_security: str | None = None,
    chart: Path = CHART,
    skip_crds: bool = False,
    **values: Any,
) -> Iterator[Release]:
    """The chart installed with ``values`` (dotted keys), watching a namespace of its own
    (``<prefix>-jobs-*``, the operator in ``<prefix>-op-*``); uninstalled and both namespaces deleted after.
    ``pod_security``: both namespaces enforce that Pod Security level (their ``enforce`` label); ``chart``:
    another version's chart folder (an upgrade's starting point); ``skip_crds``: ``helm install --skip-crds``.
    The session's cluster-wide operator is paused meanwhile (two must not reconcile the same DDPJobs)."""
    labels = {"pod-security.kubernetes.io/enforce": pod_security} if pod_security else None
    with session_operator_paused():
        release = Release(
            cluster,
            name=f"{prefix[0]}{uuid.uuid4().hex[:6]}",
            namespace=cluster.create_namespace(f"{prefix}-op", labels),
            jobs=cluster.create_namespace(f"{prefix}-jobs", labels),
        )
        try:
            release.install(chart, skip_crds=skip_crds, **values)
            yield release
        finally:
            release.helm("uninstall", release.name, "--wait", "--timeout=120s", check=False)
            for ns in (release.jobs, release.namespace):
                cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def prometheus_operator_crds(*, every_kind: bool = False) -> list[Path]:
    """The pinned ServiceMonitor, PodMonitor and PrometheusRule CRDs (hack/prometheus_crds.py); with
    ``every_kind``, every CRD the Prometheus Operator itself watches too."""
    result = subprocess.run(
        [sys.executable, str(REPO / "hack" / "prometheus_crds.py"), *(["--all"] if every_kind else [])],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, f"hack/prometheus_crds.py failed: {result.stderr}"
    folder = Path(result.stdout.strip())
    if every_kind:
        return sorted(folder.glob("*.yaml"))
    return [folder / f"{kind}.yaml" for kind in ("servicemonitors", "podmonitors", "prometheusrules")]


@dataclass
class Release:
    """One `helm install` of the chart: ``namespace`` holds the operator, which watches ``jobs``."""

    cluster: Cluster
    name: str
    namespace: str
    jobs: str

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(HELM), f"--kubeconfig={self.cluster.kubeconfig}", "--namespace", self.namespace, *args]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stderr}{result.stdout}"
            )
        return result

    def values(self, **more: Any) -> list[str]:
        """``--set-json`` arguments: the jobs namespace to watch, plus ``more`` (dotted keys)."""
        settings = {"watchNamespaces": [self.jobs], **more}
        return [
            arg for key, value in settings.items() for arg in ("--set-json", f"{key}={json.dumps(value)}")
        ]

    def install(self, chart: Path = CHART, *, skip_crds: bool = False, **more: Any) -> None:
        """``helm install``; ``skip_crds``: leave the cluster's CRDs as they are (``--skip-crds``), as a
        cluster whose CRDs ``kubectl apply --server-side`` manages has them."""
        skip = ["--skip-crds"] if skip_crds else []
        self.helm("install", self.name, str(chart), *skip, *self.values(**more), "--wait", "--timeout=240s")

    def upgrade(self, *, reuse: str = "--reuse-values", **more: Any) -> None:
        """``helm upgrade --reuse-values`` to this checkout's chart with ``more``: what the install set
        (placement included) stays. ``reuse="--reset-then-reuse-values"``: the new chart's defaults too
        (from another version's chart: its new keys)."""
        self.helm(
            "upgrade",
            self.name,
            str(CHART),
            reuse,
            *self.values(**more),
            "--wait",
            "--timeout=240s",
        )

    def uninstall(self) -> None:
        self.helm("uninstall", self.name, "--wait", "--timeout=120s")

    @property
    def selector(self) -> str:
        return f"app.kubernetes.io/instance={self.name}"

    def operator_pod(self) -> dict[str, Any]:
        """The Running operator pod of the release (waits for it)."""

        def running() -> dict[str, Any] | None:
            pods = self.cluster.kubectl_json("get", "pods", "-n", self.namespace, "-l", self.selector)[
                "items"
            ]
            live = [p for p in pods if p["status"].get("phase") == "Running"]
            return live[0] if len(live) == 1 else None

        return wait_for(running, what=f"one Running operator pod of release {self.name}", timeout=120)

    @property
    def service_account(self) -> str:
        deployment = self.cluster.kubectl_json(
            "get", "deployments", "-n", self.namespace, "-l", self.selector
        )
        name: str = deployment["items"][0]["spec"]["template"]["spec"]["serviceAccountName"]
        return name

    def leftovers(self) -> list[str]:
        """Every object of the release still in the cluster, as ``kind/namespace/name``."""
        found = []
        for kind in NAMESPACED_KINDS:
            for namespace in (self.namespace, self.jobs):
                items = self.cluster.kubectl_json("get", kind, "-n", namespace, "-l", self.selector)["items"]
                found += [f"{kind}/{namespace}/{i['metadata']['name']}" for i in items]
        for kind in CLUSTER_KINDS:
            items = self.cluster.kubectl_json("get", kind, "-l", self.selector)["items"]
            found += [f"{kind}/{i['metadata']['name']}" for i in items]
        return found


STAGES = ("ResponseStarted", "ResponseComplete")


def audit_events(cluster: Cluster, user: str) -> list[dict[str, Any]]:
    """The API server's audit events of requests made as ``user``, one per request: its ResponseComplete
    event, or ResponseStarted for a watch still open (a watch completes only when it ends)."""
    log = cluster.layout.audit_log
    by_id: dict[str, dict[str, Any]] = {}
    for file in [*sorted(log.parent.glob(f"{log.stem}-*{log.suffix}")), log]:  # rotated files first
        for line in file.read_text().splitlines():
            event = json.loads(line)
            if event["user"]["username"] != user or event.get("stage") not in STAGES:
                continue
            if event["stage"] == "ResponseComplete" or event["auditID"] not in by_id:
                by_id[event["auditID"]] = event
    return list(by_id.values())


def used_permissions(events: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(API group, resource[/subresource], verb) of every request that got past authorization."""
    used = set()
    for event in events:
        ref = event.get("objectRef") or {}
        if not ref.get("resource") or event.get("responseStatus", {}).get("code") == 403:
            continue  # discovery (non-resource URLs) and refused requests
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        used.add((ref.get("apiGroup") or "", resource, event["verb"]))
    return used


def granted_permissions(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of every RBAC rule, expanded (the chart names no wildcards)."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups") or []
        for resource in rule.get("resources") or []
        for verb in rule.get("verbs") or []
    }
