"""The operator under test: CRDs and the chart's RBAC applied to the real control plane, and
`ddpjob operator` running as a local process that authenticates as the chart's ServiceAccount."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import slow_factories
from helpers.operator_process import REPO, Operator, ddpjob, install
from testcluster import realfixture
from testcluster.fixtures import Cluster, wait_for
from testcluster.nodeconfig import LABEL, RealNode

__all__ = [
    "ON_REAL_NODES",
    "REPO",
    "SCRIPTS",
    "Operator",
    "children",
    "container_pid",
    "ddpjob",
    "events",
    "get",
    "kubelet_volumes",
    "on_real_nodes",
    "operator",
    "real_ddpjob",
    "session_operator_paused",
    "settle",
    "slow_elastic_job",
    "stores",
    "wait_phase",
    "writable_folder",
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


# Real nodes (a kubelet and containerd each, testcluster/realnode.py) run the e2e tier's pods as containers
# of the trainer image; a test takes them by asking for the session fixture ``real_nodes``
# (testcluster/realfixture.py) and placing its pods with ``on_real_nodes``. The tests that still run pods
# as processes of the node agents say why in their module.
ON_REAL_NODES: dict[str, Any] = {"nodeSelector": {LABEL: "true"}, "tolerations": [realfixture.TOLERATION]}
SCRIPTS = Path(__file__).parent


def slow_elastic_job(name: str, fast_after: Path | None = None) -> dict[str, Any]:
    """An elastic DDPJob of 2 nodes (1-3) with the tests' slow model (30 ms a forward, its module in the
    scripts folder), 800 steps: long enough to train through a resize on the node agents. ``fast_after``: a
    file whose creation lets it train at full speed (the node agents run the pods on this host, so they see
    it): a test opens it once it saw what the slow pace was for."""
    slow = {"name": "PYTHONPATH", "value": str(SCRIPTS)}  # slow_factories
    gate = [{"name": slow_factories.FAST_AFTER_ENV, "value": str(fast_after)}] if fast_after else []
    return ddpjob(
        name,
        nodes=2,
        elastic={"minNodes": 1, "maxNodes": 3},
        env=[slow, *gate],
        trainer={"steps": 800, "batchSize": 16, "checkpointEvery": 50, "model": "slow_factories:slow_mlp"},
        syncCheck={"everySteps": 100},
    )


def on_real_nodes(*, scripts: bool = False, **template: Any) -> dict[str, Any]:
    """A ``spec.podTemplate`` that puts the pods on the real nodes; with ``scripts``, this folder
    (tests/e2e) mounted read-only at its own path, so a command may name a script here as it would one of
    its image (the trainer image holds the project's code, not its tests)."""
    placed: dict[str, Any] = {**ON_REAL_NODES, **template}
    if scripts:
        mount = {"name": "e2e-scripts", "hostPath": {"path": str(SCRIPTS)}}
        placed["volumes"] = [*template.get("volumes", []), mount]
        placed["volumeMounts"] = [
            *template.get("volumeMounts", []),
            {"name": "e2e-scripts", "mountPath": str(SCRIPTS), "readOnly": True},
        ]
    return placed


def real_ddpjob(name: str, **spec: Any) -> dict[str, Any]:
    """``ddpjob(name, **spec)`` with its pods on the real nodes (``on_real_nodes``; ``scripts=True``
    mounts this folder)."""
    template = on_real_nodes(scripts=bool(spec.pop("scripts", False)), **spec.pop("podTemplate", {}))
    return ddpjob(name, podTemplate=template, **spec)


def writable_folder(path: Path) -> Path:
    """``path``, made and writable by the trainer image's uid 1000 (a hostPath the kubelet mounts as is)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)
    return path


def container_pid(nodes: list[RealNode], pod: dict[str, Any], container: str = "trainer") -> int:
    """The host PID of ``container``'s main process in ``pod`` (a real node's pod), from its containerd."""
    node = next(n for n in nodes if n.name == pod["spec"]["nodeName"])
    (status,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == container]
    return realfixture.host_pid(node, status["containerID"])


def kubelet_volumes(nodes: list[RealNode], pod: dict[str, Any]) -> Path:
    """Where the kubelet of ``pod``'s real node keeps the pod's volumes (``<plugin>/<volume>/``)."""
    node = next(n for n in nodes if n.name == pod["spec"]["nodeName"])
    return node.dir / "kubelet" / "pods" / pod["metadata"]["uid"] / "volumes"


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
    """The DDPJob's ``kind`` (jobs, pods, services) by its label: its attempts' and their workers, not an
    elastic job's rendezvous store (:func:`stores`)."""
    selector = f"ddpjob.io/job-name={name},!ddpjob.io/rendezvous-store"
    items: list[dict[str, Any]] = cluster.kubectl_json("get", kind, "-n", namespace, "-l", selector)["items"]
    return items


def stores(cluster: Cluster, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
    """An elastic DDPJob's rendezvous store Jobs or pods (children/store_job.py)."""
    selector = f"ddpjob.io/job-name={name},ddpjob.io/rendezvous-store=true"
    items: list[dict[str, Any]] = cluster.kubectl_json("get", kind, "-n", namespace, "-l", selector)["items"]
    return items


def newest_step(folder: Path) -> int:
    """The step of the newest checkpoint in ``folder`` (``step-00000040.job.pt``), 0 for none."""
    return max((int(p.name.split(".")[0].removeprefix("step-")) for p in folder.glob("step-*.pt")), default=0)


def events(cluster: Cluster, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    """The Events about object ``name`` with ``reason``."""
    selector = f"involvedObject.name={name},reason={reason}"
    found: list[dict[str, Any]] = cluster.kubectl_json(
        "get", "events", "-n", namespace, "--field-selector", selector
    )["items"]
    return found


def settle(seconds: float) -> None:
    """A window in which something must NOT happen (the caller says why this long); never a wait for
    something to happen (that is :func:`testcluster.fixtures.wait_for`, with a deadline)."""
    time.sleep(seconds)
