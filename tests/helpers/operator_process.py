"""The operator under test, for the e2e fixtures and ``bench/operator_bench.py`` alike: :func:`install`
applies the CRD and the chart's RBAC to the real control plane and returns a kubeconfig of the chart's
ServiceAccount; :class:`Operator` runs `ddpjob operator` as a local process that authenticates with it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from testcluster.audit import service_account
from testcluster.fixtures import Cluster, wait_for

REPO = Path(__file__).resolve().parents[2]
OPERATOR_NAMESPACE = "ddpjob-system"
SERVICE_ACCOUNT = "ddpjob-operator"
OPERATOR_USER = service_account(OPERATOR_NAMESPACE, SERVICE_ACCOUNT)
"""The user the operator's requests carry in the API server's audit log."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Operator:
    """`ddpjob operator` as a process; start and stop it at will (operator-restart tests)."""

    def __init__(
        self, kubeconfig: Path, log: Path, *, args: tuple[str, ...] = (), pythonpath: tuple[Path, ...] = ()
    ) -> None:
        """``args``: more of `ddpjob operator`'s flags (``--namespace=...``); ``pythonpath``: folders whose
        ``ddp_operator`` and ``ddp_trainer`` run instead of this checkout's (an earlier version's)."""
        user = yaml.safe_load(kubeconfig.read_text())["users"][0]["name"]
        assert user.startswith("system:serviceaccount:"), (
            f"the operator under test authenticates as the chart's ServiceAccount, not as {user}"
        )
        self.kubeconfig, self.log, self.args, self.pythonpath = kubeconfig, log, args, pythonpath
        self.process: subprocess.Popen[bytes] | None = None
        self.metrics_port = 0

    def start(self) -> None:
        liveness, self.metrics_port = free_port(), free_port()
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        if self.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join([*map(str, self.pythonpath), env.get("PYTHONPATH", "")])
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ddp_operator",
                    "operator",
                    f"--liveness=127.0.0.1:{liveness}",
                    f"--metrics-port={self.metrics_port}",
                    *self.args,
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

    def memory_mib(self) -> dict[str, float]:
        """The process's resident memory now (``rss``) and its peak since it started (``peak``), MiB,
        from /proc/<pid>/status (VmRSS, VmHWM). The operator is one process: Kopf's asyncio loop and
        the handler threads."""
        assert self.process is not None and self.process.poll() is None, "the operator is not running"
        fields = {}
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024  # kB
        return {"rss": fields["VmRSS"], "peak": fields["VmHWM"]}


def chart_rbac(*values: str) -> list[dict[str, Any]]:
    """The chart's objects but its Deployment: ServiceAccount, ClusterRole, bindings (``helm template``,
    with ``values``: ``--set`` flags)."""
    helm = Path(sys.executable).with_name("helm")
    rendered = subprocess.run(
        [
            str(helm),
            "template",
            "ddpjob",
            str(REPO / "charts" / "ddpjob-operator"),
            "--namespace",
            OPERATOR_NAMESPACE,
            *values,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] != "Deployment"]


def install(cluster: Cluster) -> Path:
    """Applies the CRD and the chart's RBAC; returns a kubeconfig of the chart's ServiceAccount."""
    cluster.kubectl("apply", "--server-side", "-f", str(REPO / "manifests" / "crd.yaml"))
    cluster.wait_established("crd/ddpjobs.ddpjob.io")
    if cluster.kube.get_or_none(f"/api/v1/namespaces/{OPERATOR_NAMESPACE}") is None:
        cluster.kubectl("create", "namespace", OPERATOR_NAMESPACE)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(chart_rbac()))
    return cluster.serviceaccount_kubeconfig(OPERATOR_NAMESPACE, SERVICE_ACCOUNT)


def ddpjob(name: str, **spec: Any) -> dict[str, Any]:
    """A DDPJob document: 2 nodes × 1 process on the CPU unless ``spec`` says otherwise."""
    return {
        "apiVersion": "ddpjob.io/v1alpha1",
        "kind": "DDPJob",
        "metadata": {"name": name},
        "spec": {"nodes": 2, "procsPerNode": 1, "device": "cpu", **spec},
    }
