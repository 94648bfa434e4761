"""The operator under test: CRDs and the chart's RBAC applied to the real control plane, and
`ddpjob operator` running as a local process that authenticates as the chart's ServiceAccount."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cluster.fixtures import Cluster, wait_for

from .operator_process import REPO, Operator, ddpjob, install

__all__ = [
    "REPO",
    "Operator",
    "children",
    "ddpjob",
    "events",
    "get",
    "operator",
    "session_operator_paused",
    "settle",
    "wait_phase",
]


@pytest.fixture(scope="session")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    kubeconfig = install(cluster)
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


def events(cluster: Cluster, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    """The Events about object ``name`` with ``reason``."""
    selector = f"involvedObject.name={name},reason={reason}"
    found: list[dict[str, Any]] = cluster.kubectl_json(
        "get", "events", "-n", namespace, "--field-selector", selector
    )["items"]
    return found


def settle(seconds: float) -> None:
    time.sleep(seconds)
