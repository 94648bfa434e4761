"""Upgrading the operator while DDPJobs run (issue 45, item 1), on the real nodes.

The previous release is the tag ``v0.1.0`` (its commit, :data:`PREVIOUS_COMMIT`, where the tag is absent):
its chart installed by ``helm install`` with no operator pod (``replicaCount: 0``: its RBAC, ServiceAccount
and peering object), and its own code (``git archive``) running as `ddpjob operator` with that
ServiceAccount's token, as its pod would. One DDPJob trains, another waits for a Secret. Then the upgrade a
user makes: the old operator stops, ``helm upgrade --reset-then-reuse-values`` to this checkout's chart,
whose operator pod runs this checkout's image. The training job keeps its pods (same UIDs), its attempt and
no restart, and Succeeds verified; every status field the old operator wrote is still there; the waiting
job starts once its Secret exists, under the new operator.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.e2e import ON_REAL_NODES, REPO, children, get, real_ddpjob, wait_phase
from helpers.helmrelease import Release, installed
from helpers.operator_process import Operator
from testcluster.fixtures import Cluster, manifests, wait_for
from testcluster.nodeconfig import RealNode

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PREVIOUS = "v0.1.0"
PREVIOUS_COMMIT = "b69dccef8e83bcfcc45070a9e8960a401a0c8eac"


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's operator, trainer and chart, from git."""
    tagged = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "-q", f"{PREVIOUS}^{{commit}}"])
    ref = PREVIOUS if tagged.returncode == 0 else PREVIOUS_COMMIT
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref, "operator", "trainer_image", "charts"],
        capture_output=True,
        check=False,
    )
    assert archive.returncode == 0, (
        f"neither the tag {PREVIOUS} nor its commit {PREVIOUS_COMMIT} is in this clone (a shallow one?): "
        f"{archive.stderr.decode()}"
    )
    out = tmp_path_factory.mktemp("previous")
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


@pytest.fixture
def old_release(cluster: Cluster, real_nodes: list[RealNode], previous: Path) -> Iterator[Release]:
    chart = previous / "charts" / "ddpjob-operator"
    # the CRDs are this checkout's, applied by `kubectl apply --server-side` as the README installs them and
    # as an upgrade applies them first: helm leaves them alone (an older chart's CRD conflicts with kubectl's
    # fields where the schema grew since, e.g. status.elastic.belowMinSince)
    cluster.kubectl("apply", "--server-side", "-f", str(REPO / "manifests" / "crd.yaml"))
    with installed(
        cluster, "upgrade", chart=chart, skip_crds=True, replicaCount=0, **ON_REAL_NODES
    ) as release:
        yield release


def _pod_uids(cluster: Cluster, namespace: str, name: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in children(cluster, namespace, "pods", name)}


def test_an_upgrade_leaves_running_jobs_alone_and_the_new_operator_goes_on_from_their_status(
    cluster: Cluster, real_nodes: list[RealNode], previous: Path, old_release: Release, tmp_path: Path
) -> None:
    ns = old_release.jobs
    kubeconfig = cluster.serviceaccount_kubeconfig(old_release.namespace, old_release.service_account)
    old = Operator(
        kubeconfig,
        tmp_path / "old-operator.log",
        args=("--priority=auto", "--peering-lifetime=15", f"--namespace={ns}"),
        pythonpath=(previous / "operator", previous / "trainer_image"),
    )
    found = subprocess.run(
        [sys.executable, "-c", "import ddp_operator; print(ddp_operator.__file__)"],
        env={**os.environ, "PYTHONPATH": str(previous / "operator")},
        capture_output=True,
        text=True,
    )
    assert found.stdout.startswith(str(previous)), f"the old operator would not run its own code: {found}"
    training = real_ddpjob(
        "training",
        trainer={"steps": 1500, "batchSize": 16, "checkpointEvery": 500},
        syncCheck={"everySteps": 100},
    )
    waiting = real_ddpjob(
        "waiting", envFrom=[{"secretRef": {"name": "late"}}], command=["python", "-c", "pass"]
    )
    old.start()
    try:
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=manifests(training, waiting))
        wait_phase(cluster, ns, "training", "Running", timeout=240)
        wait_for(
            lambda: get(cluster, ns, "waiting").get("status", {}).get("phase") == "Pending",
            what="the waiting DDPJob Pending under the old operator",
            timeout=120,
        )
        before = get(cluster, ns, "training")["status"]
        pods = _pod_uids(cluster, ns, "training")
    finally:
        old.stop()
    assert len(pods) == 2 and before["attempt"] == 1, before

    old_release.upgrade(reuse="--reset-then-reuse-values", replicaCount=1)
    operator_pod = old_release.operator_pod()
    assert operator_pod["spec"]["nodeName"] in {n.name for n in real_nodes}

    def rewritten() -> dict[str, Any] | None:  # the new operator's first status of the running job
        status: dict[str, Any] = get(cluster, ns, "training")["status"]
        return status if status != before else None

    mid = wait_for(rewritten, what="the new operator's status of the running job", timeout=120, every=0.5)
    assert mid["phase"] == "Running", f"the job ended before the new operator saw it run: {mid}"
    dropped = set(before) - set(mid)
    assert not dropped, f"status fields the old operator wrote and the new one dropped: {sorted(dropped)}"
    for field in ("startTime", "attempt"):
        assert mid[field] == before[field], (field, before[field], mid[field])
    final = wait_phase(cluster, ns, "training", "Succeeded", "Failed", timeout=480)["status"]
    assert final["phase"] == "Succeeded" and final["sync"]["verified"] is True, final
    assert (final["attempt"], final.get("restarts", 0)) == (1, 0), final
    assert _pod_uids(cluster, ns, "training") == pods, "the upgrade replaced the running job's pods"

    cluster.kubectl("create", "secret", "generic", "late", "-n", ns, "--from-literal=k=v")
    done: dict[str, Any] = wait_phase(cluster, ns, "waiting", "Succeeded", "Failed", timeout=240)["status"]
    assert (done["phase"], done["attempt"], done.get("restarts", 0)) == ("Succeeded", 1, 0), done
