"""pytest fixtures for tests that need the real control plane (``@pytest.mark.cluster``).

- ``cluster`` (session): reuses a cluster that ``make cluster-up`` started, else starts one and stops it
  at the end of the session (``DDPJOB_KEEP_CLUSTER=1`` keeps it up). Skips, saying why, where this
  machine cannot run it (not root, no ``ip``, no Go and no cached binaries); fails instead in CI
  (``CI=true``: :func:`ci.skip_or_fail`).
- ``namespace`` (function): a fresh namespace whose ``default`` ServiceAccount exists; deleted afterwards.
- ``pytest_collection_finish`` builds the binaries before the first test when a cluster test was
  collected, so the first build (tens of minutes) does not count against a test's timeout.

Registered for the tests under ``testcluster`` by their conftest; elsewhere through the plugin module
``tests/helpers/cluster_fixtures.py`` (``pytest_plugins = ["cluster_fixtures"]`` in ``tests/conftest.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from . import lifecycle, serviceaccounts
from .audit import AuditLog
from .ci import skip_or_fail
from .kubeapi import Kube
from .layout import BUILD_SCRIPT, Layout

T = TypeVar("T")


def unavailable_reason() -> str | None:
    """Why this machine cannot run the test cluster, or None."""
    if os.geteuid() != 0:
        return "the test cluster needs root (network namespaces for pods)"
    if not shutil.which("ip"):
        return "the test cluster needs iproute2's `ip`"
    if not shutil.which("openssl"):
        return "the test cluster needs the openssl command line tool"
    if not shutil.which("go") and not Path("/usr/local/go/bin/go").exists():
        return "the test cluster is built with Go, and there is no `go` here"
    return None


@dataclass
class Cluster:
    """A running test cluster: its files, a JSON client, and kubectl bound to its kubeconfig."""

    layout: Layout
    kube: Kube

    @property
    def kubeconfig(self) -> Path:
        return self.layout.kubeconfig

    @property
    def audit(self) -> AuditLog:
        """What ServiceAccounts asked of the API server (:mod:`audit`)."""
        return AuditLog(self.layout.audit_log)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, kubeconfig: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Runs ``kubectl`` against the cluster; ``check`` raises with its stderr on failure."""
        cmd = ["kubectl", f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        result = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=300)
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stderr}{result.stdout}"
            )
        return result

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def wait_established(self, *crds: str, timeout: float = 60.0) -> None:
        """Wait until each CRD (``crd/<name>``) says Established. Not ``kubectl wait``: it fails at once
        ('.status.conditions accessor error') on a CRD read before the API server wrote its conditions."""

        def established(crd: str) -> bool:
            got = self.kubectl("get", crd, "-o", "json", check=False)
            if got.returncode != 0:
                return False
            conditions = json.loads(got.stdout).get("status", {}).get("conditions") or []
            return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

        for crd in crds:
            wait_for(lambda crd=crd: established(crd), what=f"{crd} Established", timeout=timeout, every=0.2)

    def serviceaccount_kubeconfig(self, namespace: str, name: str) -> Path:
        """A kubeconfig that authenticates as ``system:serviceaccount:<namespace>:<name>``."""
        return serviceaccounts.write_kubeconfig(self.kube, self.layout, namespace, name)

    def create_namespace(self, prefix: str = "t", labels: dict[str, str] | None = None) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        metadata: dict[str, Any] = {"name": name, **({"labels": labels} if labels else {})}
        self.kube.create(
            "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}
        )
        wait_for(
            lambda: self.kube.get_or_none(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
            what=f"ServiceAccount {name}/default",
        )
        return name

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self.kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")

    def restart_apiserver(self, down_seconds: float = 0.0) -> float:
        """Stops kube-apiserver, keeps it down ``down_seconds``, starts it on the same etcd; returns the
        outage in seconds."""
        return lifecycle.restart_apiserver(self.layout, down_seconds=down_seconds)

    def logs(self, namespace: str, pod: str, container: str | None = None) -> str:
        args = ["logs", "-n", namespace, pod] + ([f"-c={container}"] if container else [])
        return self.kubectl(*args).stdout


def wait_for(check: Callable[[], T | None], *, what: str, timeout: float = 60, every: float = 0.2) -> T:
    """Polls ``check`` until it returns something truthy, which it returns; fails naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Builds the binaries before the first test, outside any test's timeout, if a cluster test will run."""
    wants_cluster = any(item.get_closest_marker("cluster") for item in session.items)
    if not wants_cluster or unavailable_reason() is not None or session.config.option.collectonly:
        return
    if subprocess.run(["bash", str(BUILD_SCRIPT), "--check"], capture_output=True).returncode == 0:
        return
    log = Path(tempfile.gettempdir()) / "ddpjob-cluster-build.log"
    say = session.config.pluginmanager.get_plugin("terminalreporter")
    if say:
        say.write_line(
            f"building the test cluster (first time on this machine: ~25 min on 2 cores); log: {log}"
        )
    with open(log, "w") as out:
        built = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.DEVNULL, stderr=out)
    if say:
        say.write_line(f"test cluster build: {'done' if built.returncode == 0 else 'FAILED'}; log: {log}")


@contextlib.contextmanager
def running_cluster(layout: Layout | None = None) -> Iterator[Cluster]:
    """The cluster of ``layout``: the one already up, else one started here and stopped on exit
    (unless ``DDPJOB_KEEP_CLUSTER`` is set). Outside pytest too (``bench/operator_bench.py``)."""
    layout = layout or Layout.default()
    if (layout.root / lifecycle.BY_HAND_MARKER).exists() and lifecycle.is_up(layout):
        raise RuntimeError(
            f"the test cluster at {layout.root} was brought up with REAL_NODES=1 (its agents cordoned, its "
            "real nodes untainted, for people); the tests start their own real nodes: "
            "`make cluster-down` first"
        )
    started_here = not lifecycle.is_up(layout)
    if started_here:
        lifecycle.up(layout)
    try:
        yield Cluster(layout, Kube(str(layout.kubeconfig)))
    finally:
        if started_here and not os.environ.get("DDPJOB_KEEP_CLUSTER"):
            lifecycle.down(layout)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    reason = unavailable_reason()
    if reason:
        skip_or_fail(reason)
    with running_cluster() as running:
        yield running


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = cluster.create_namespace(request.node.name.lower().replace("_", "-")[:40].strip("-"))
    yield name
    cluster.kube.delete(f"/api/v1/namespaces/{name}")


def manifests(*objects: dict[str, Any]) -> str:
    """Objects as one JSON document list, for ``kubectl apply -f -``."""
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})


def python_pod(name: str, code: str, *, restart: str = "Never", **spec: Any) -> dict[str, Any]:
    """A pod whose one container runs ``python -c code`` (the image is ignored by the node agent)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": spec.pop("labels", {})},
        "spec": {
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": spec.pop("grace", 5),
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11",
                    "command": ["python", "-c", code],
                    "env": spec.pop("env", []),
                }
            ],
            **spec,
        },
    }


def host_path_volume(name: str, storage_class: str, path: str) -> dict[str, Any]:
    """A 1Gi PersistentVolume on a host folder that only claims of ``storage_class`` bind, ReadWriteOnce
    (the claims' default) and ReadWriteMany: a claim binds a volume that offers every mode it asks for."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
            "storageClassName": storage_class,
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": path},
        },
    }


__all__: Sequence[str] = [
    "Cluster",
    "cluster",
    "host_path_volume",
    "manifests",
    "namespace",
    "python_pod",
    "running_cluster",
    "wait_for",
]
