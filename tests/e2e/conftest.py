"""The operator under test: CRDs and the chart's RBAC applied to the real control plane, and
`ddpjob operator` running as a local process that authenticates as the chart's ServiceAccount."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster.fixtures import Cluster, wait_for

REPO = Path(__file__).resolve().parents[2]
OPERATOR_NAMESPACE = "ddpjob-system"
SERVICE_ACCOUNT = "ddpjob-operator"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Operator:
    """`ddpjob operator` as a process; start and stop it at will (operator-restart tests)."""

    def __init__(self, kubeconfig: Path, log: Path) -> None:
        user = yaml.safe_load(kubeconfig.read_text())["users"][0]["name"]
        assert user.startswith("system:serviceaccount:"), (
            f"the operator under test authenticates as the chart's ServiceAccount, not as {user}"
        )
        self.kubeconfig, self.log = kubeconfig, log
        self.process: subprocess.Popen[bytes] | None = None
        self.metrics_port = 0

    def start(self) -> None:
        liveness, self.metrics_port = _port(), _port()
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ddp_operator",
                    "operator",
                    f"--liveness=127.0.0.1:{liveness}",
                    f"--metrics-port={self.metrics_port}",
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

        def healthy() -> bool:
            assert self.process is not None and self.process.poll() is None, self.log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{liveness}/healthz", timeout=1) as response:
                    return bool(response.status == 200)
            except OSError:
                return False

        wait_for(healthy, what="the operator's /healthz", timeout=60)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as response:
            text: str = response.read().decode()
            return text


def _chart_rbac() -> list[dict[str, Any]]:
    helm = Path(sys.executable).with_name("helm")
    rendered = subprocess.run(
        [
            str(helm),
            "template",
            "ddpjob",
            str(REPO / "charts" / "ddpjob-operator"),
            "--namespace",
            OPERATOR_NAMESPACE,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] != "Deployment"]


@pytest.fixture(scope="session")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    cluster.kubectl("apply", "--server-side", "-f", str(REPO / "manifests" / "crd.yaml"))
    cluster.kubectl("wait", "--for=condition=Established", "crd/ddpjobs.ddpjob.io", "--timeout=60s")
    if cluster.kube.get_or_none(f"/api/v1/namespaces/{OPERATOR_NAMESPACE}") is None:
        cluster.kubectl("create", "namespace", OPERATOR_NAMESPACE)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(_chart_rbac()))
    kubeconfig = cluster.serviceaccount_kubeconfig(OPERATOR_NAMESPACE, SERVICE_ACCOUNT)
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    running = Operator(kubeconfig, log)
    running.start()
    SESSION_OPERATORS.append(running)
    try:
        yield running
    finally:
        SESSION_OPERATORS.remove(running)
        running.stop()
        print(f"operator log: {log}")


SESSION_OPERATORS: list[Operator] = []  # the `operator` fixture's, while the session holds it


@contextlib.contextmanager
def session_operator_paused() -> Iterator[None]:
    """Stops the session's cluster-wide operator (when a test has started it) and starts it again after:
    a test that installs the chart runs its own operator, and two must not reconcile the same DDPJobs."""
    paused = [op for op in SESSION_OPERATORS if op.process is not None]
    for op in paused:
        op.stop()
    try:
        yield
    finally:
        for op in paused:
            op.start()


def ddpjob(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ddpjob.io/v1alpha1",
        "kind": "DDPJob",
        "metadata": {"name": name},
        "spec": {"nodes": 2, "procsPerNode": 1, "device": "cpu", **spec},
    }


def get(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = cluster.kubectl_json("get", "ddpjob", name, "-n", namespace)
    return found


def wait_phase(
    cluster: Cluster, namespace: str, name: str, *phases: str, timeout: float = 240
) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        job = get(cluster, namespace, name)
        return job if job.get("status", {}).get("phase") in phases else None

    try:
        return wait_for(
            reached, what=f"DDPJob {namespace}/{name} to be {' or '.join(phases)}", timeout=timeout, every=0.5
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last status: {get(cluster, namespace, name).get('status')}") from None


def children(cluster: Cluster, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl_json(
        "get", kind, "-n", namespace, "-l", f"ddpjob.io/job-name={name}"
    )["items"]
    return items


def settle(seconds: float) -> None:
    time.sleep(seconds)
