"""The product as shipped, on real nodes (a kubelet and containerd each, ``testcluster/realnode.py``):
`helm install` runs the operator from its image as the chart's Deployment on a real node, and the DDPJobs
it reconciles train across both real nodes from the trainer image, verified: the built-in trainer, the
no-code and plain-loop examples as shipped (their scripts are in the trainer image, and the init
container copies the sync hook into a volume the kubelet shares with the trainer container), the
quickstart with its claim bound to a PersistentVolume that the kubelets mount; and a lost node. Both
namespaces (the operator's and the jobs') enforce Pod Security ``restricted``, as platform teams label
training namespaces: every pod above is admitted as rendered, and a spec that breaks the level is refused
by the API server, which the DDPJob's status says, naming the field. Skipped, saying why, where real nodes
cannot run (``realfixture.real_nodes``). The other e2e modules run their pods on these nodes too, under the
operator as a local process (tests/helpers/e2e.py).
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_operator.runtime.keeper import RENEW_SECONDS
from helpers.e2e import ON_REAL_NODES, REPO, children, container_pid, events, get, wait_phase, writable_folder
from helpers.helmrelease import Release, audit_events, installed
from helpers.operator_process import ddpjob
from testcluster import realfixture
from testcluster.fixtures import Cluster, host_path_volume, manifests, wait_for
from testcluster.nodeconfig import RealNode

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def host_uid(nodes: list[RealNode], pod: dict[str, Any], container: str) -> str:
    status = Path(f"/proc/{container_pid(nodes, pod, container)}/status").read_text()
    return next(x.split()[1] for x in status.splitlines() if x.startswith("Uid:"))


@pytest.fixture(scope="module")
def release(cluster: Cluster, real_nodes: list[RealNode]) -> Iterator[Release]:
    with installed(cluster, "real", pod_security="restricted", **ON_REAL_NODES) as installed_release:
        yield installed_release


def finished(cluster: Cluster, namespace: str, name: str, nodes: list[RealNode]) -> dict[str, Any]:
    """Waits for DDPJob ``name`` to end; checks it Succeeded, verified, with a pod on each real node."""
    final = wait_phase(cluster, namespace, name, "Succeeded", "Failed", timeout=480)
    pods = children(cluster, namespace, "pods", name)
    detail = {p["metadata"]["name"]: p["status"].get("containerStatuses") for p in pods}
    if final["status"]["phase"] != "Succeeded":
        logs = [cluster.kubectl("logs", "-n", namespace, p["metadata"]["name"], check=False) for p in pods]
        raise AssertionError(f"{final['status']}\n{detail}\n" + "\n".join(r.stdout[-2000:] for r in logs))
    assert final["status"]["sync"]["verified"] is True, final["status"]
    assert {p["spec"]["nodeName"] for p in pods} == {n.name for n in nodes}, detail
    for pod in pods:
        (trainer,) = pod["status"]["containerStatuses"]
        assert trainer["imageID"], trainer  # an image the node's containerd holds
        assert trainer["state"]["terminated"]["exitCode"] == 0, trainer
    return final


def test_the_chart_runs_the_operator_image_and_a_ddpjob_trains_on_real_nodes(
    cluster: Cluster, real_nodes: list[RealNode], release: Release
) -> None:
    operator_pod = release.operator_pod()
    assert operator_pod["spec"]["nodeName"] in {n.name for n in real_nodes}, operator_pod["spec"]
    (status,) = operator_pod["status"]["containerStatuses"]
    assert status["containerID"].startswith("containerd://")
    assert host_uid(real_nodes, operator_pod, status["name"]) == "1000"

    job: dict[str, Any] = ddpjob(
        "real",
        trainer={"steps": 30, "batchSize": 16, "checkpointEvery": 10},
        syncCheck={"everySteps": 10, "onDivergence": "Fail"},
        maxRestarts=0,
        podTemplate=ON_REAL_NODES,
    )
    cluster.kubectl("apply", "-n", release.jobs, "-f", "-", input=manifests(job))
    finished(cluster, release.jobs, "real", real_nodes)


@pytest.mark.parametrize("example", ["no-code.yaml", "plain-loop.yaml"])
def test_the_examples_of_users_scripts_train_on_real_nodes(
    cluster: Cluster, real_nodes: list[RealNode], release: Release, example: str
) -> None:
    """As shipped, but for placement: their scripts are the trainer image's copies of ``examples/*.py``;
    the sync hook reaches them through the init container (on by default)."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / example).read_text())
    doc["spec"]["podTemplate"] = ON_REAL_NODES
    cluster.kubectl("apply", "-n", release.jobs, "-f", "-", input=manifests(doc))
    name = doc["metadata"]["name"]
    final = finished(cluster, release.jobs, name, real_nodes)
    (job,) = children(cluster, release.jobs, "jobs", name)
    (init,) = job["spec"]["template"]["spec"]["initContainers"]
    assert init["command"][:3] == ["python", "-m", "ddp_trainer.inject"], init
    assert final["status"]["sync"]["checks"] >= 2, final["status"]


def test_the_quickstart_trains_on_real_nodes_with_its_claim_mounted_by_the_kubelets(
    cluster: Cluster, real_nodes: list[RealNode], release: Release, tmp_path: Path
) -> None:
    """``examples/quickstart.yaml`` as shipped but for placement and a shorter run: its 1Gi ReadWriteOnce
    claim bound to a hostPath PersistentVolume (what a default class would give), which each node's
    kubelet mounts into its pod; the checkpoints the containers wrote (as uid 1000) are on the volume."""
    folder = writable_folder(tmp_path / "pv")
    ns = release.jobs
    volume = host_volume(f"rwo-{ns}", ns, "quickstart-checkpoints", folder, "ReadWriteOnce")
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    doc["spec"]["trainer"].update(steps=40, checkpointEvery=20)
    doc["spec"]["syncCheck"]["everySteps"] = 20
    doc["spec"]["podTemplate"] = ON_REAL_NODES
    try:
        cluster.kubectl("apply", "-f", "-", input=manifests(volume))
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=manifests(doc))
        finished(cluster, ns, "quickstart", real_nodes)
        claim = cluster.kubectl_json("get", "pvc", "quickstart-checkpoints", "-n", ns)
        assert claim["spec"]["accessModes"] == ["ReadWriteOnce"] and claim["status"]["phase"] == "Bound"
        written = sorted(folder.glob("step-*.pt"))
        assert [p.name for p in written] == ["step-00000020.quickstart.pt", "step-00000040.quickstart.pt"]
        assert {p.stat().st_uid for p in written} == {1000}
    finally:
        cluster.kubectl("delete", "ddpjob", "quickstart", "-n", ns, "--wait=false", check=False)
        cluster.kubectl("delete", "pv", f"rwo-{ns}", "--wait=false", check=False)


POD_NAME = "authentication.kubernetes.io/pod-name"
PEERING_LIFETIME = 12  # the chart's peeringLifetimeSeconds
TAKEOVER_GOAL = 20  # seconds from the loss to the standby's first write (issue 45's goal)


def acting_writes(cluster: Cluster, release: Release, peering: bool = False) -> list[tuple[float, str, str]]:
    """(time, operator pod, what) of every write the release's operator made but to its peering object
    (``peering``: only those, its keep-alives and renewals, and only those the API server accepted: a
    refused renewal keeps no record alive), from the API server's audit log: each by the pod whose bound
    token made it."""
    user = f"system:serviceaccount:{release.namespace}:{release.service_account}"
    out = []
    for event in audit_events(cluster, user):
        ref = event.get("objectRef") or {}
        if event["verb"] not in ("create", "update", "patch", "delete") or peering != (
            "kopfpeering" in ref.get("resource", "")
        ):
            continue
        if peering and (event.get("responseStatus") or {}).get("code", 200) >= 400:
            continue
        # when the API server received it: a write the killed process sent just before its SIGKILL may
        # complete just after it, and is still that process's
        when = dt.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
        pod = ((event["user"].get("extra") or {}).get(POD_NAME) or ["?"])[0]
        what = f"{event['verb']} {ref.get('resource')}/{ref.get('subresource', '')} {ref.get('name', '')}"
        out.append((when, pod, what))
    return sorted(out)


def overlaps(
    writes: list[tuple[float, str, str]], renewals: list[tuple[float, str, str]], lifetime: float
) -> list[str]:
    """Each moment the writing replica changed that the peering does not explain: a change from A to B is
    explained when A had been silent for most of its lifetime in the lifetime before (dead to its peers: B
    took over), or B had been (a stalled replica waking: what it had in flight lands, then it fences
    itself), or A wrote nothing more 3 s after it (a replica of lower priority that yielded)."""
    unexplained = []
    for (t_a, a, _), (t_b, b, what) in itertools.pairwise(writes):
        if a == b:
            continue
        later = [when for when, by, _ in writes if by == a and t_b + 3 < when]
        since = t_b - lifetime - 5  # a silence that ended just before (a replica waking renews first)
        explained = (
            longest_silence(renewals, a, since, t_b) >= lifetime - 4
            or longest_silence(renewals, b, since, t_b) >= lifetime - 4
            or not later
        )
        if not explained:
            unexplained.append(
                f"{b} wrote ({what}) at {t_b:.3f} after {a} at {t_a:.3f}, both renewing (longest silences "
                f"{longest_silence(renewals, a, since, t_b):.1f} s and "
                f"{longest_silence(renewals, b, since, t_b):.1f} s), "
                f"and {a} wrote again {later[0] - t_b:.1f} s later"
            )
    return unexplained


def test_a_standby_operator_takes_over_within_the_peering_lifetime_and_never_two_act(
    cluster: Cluster, real_nodes: list[RealNode]
) -> None:
    """replicaCount 2: both operator pods run, one acts. Its process is SIGKILLed on its node (a death
    without a word: its peering record stays until it expires); a DDPJob applied at that moment is taken up
    by the standby within the peering lifetime and Succeeds. The audit log shows only the leader's writes
    before the kill, and all of its pod's writes before the standby's first: never two acting."""
    # The operator pods request half a CPU, as much as a trainer process here, so that the trainers that
    # saturate this machine's 2 cores do not starve them. A replica silent for longer than its 12 s lease
    # is dead to its peers: a standby takes over and writes it had in flight land when it runs again
    # (docs/operator.md, "A stalled replica"). Silences of 10-18 s measured here came from the cluster's pod
    # bridge changing its MAC address (testcluster/netns.BRIDGE_MAC, now fixed), not from the operator.
    with installed(
        cluster,
        "standby",
        pod_security="restricted",
        replicaCount=2,
        **{"resources.requests.cpu": "500m"},
        **ON_REAL_NODES,
    ) as release:

        def two_running() -> list[dict[str, Any]] | None:
            pods = cluster.kubectl_json("get", "pods", "-n", release.namespace, "-l", release.selector)[
                "items"
            ]
            live = [p for p in pods if p["status"].get("phase") == "Running"]
            return live if len(live) == 2 else None

        pods = wait_for(two_running, what="two Running operator pods", timeout=120)
        first = ddpjob(
            "first", trainer={"steps": 20}, syncCheck={"everySteps": 10}, podTemplate=ON_REAL_NODES
        )
        cluster.kubectl("apply", "-n", release.jobs, "-f", "-", input=manifests(first))
        wait_phase(cluster, release.jobs, "first", "Running", "Succeeded", timeout=180)
        names = [p["metadata"]["name"] for p in pods]

        def said(why: str, writes: list[tuple[float, str, str]], since: float) -> AssertionError:
            near = [(round(when - since, 3), pod, what) for when, pod, what in writes if when > since - 5]
            logs = "\n".join(_operator_logs(cluster, release.namespace, name) for name in names)
            return AssertionError(f"{why}; writes (s after {since:.3f}): {near}\n{logs}")

        writes, renewals = acting_writes(cluster, release), acting_writes(cluster, release, peering=True)
        if unexplained := overlaps(writes, renewals, PEERING_LIFETIME):
            raise said(f"two acting before any kill: {unexplained}", writes, writes[0][0])
        leader_name = writes[-1][1]  # the one acting now
        (leader,) = [p for p in pods if p["metadata"]["name"] == leader_name]
        (standby,) = [p for p in pods if p is not leader]
        standby_name = standby["metadata"]["name"]
        pid = container_pid(real_nodes, leader, "operator")  # asks containerd: not inside the kill's moment
        os.kill(pid, signal.SIGKILL)
        killed = time.time()
        second = ddpjob(
            "second", trainer={"steps": 20}, syncCheck={"everySteps": 10}, podTemplate=ON_REAL_NODES
        )
        cluster.kubectl("apply", "-n", release.jobs, "-f", "-", input=manifests(second))
        wait_for(
            lambda: children(cluster, release.jobs, "jobs", "second"),
            what="the standby to create the second DDPJob's Job",
            timeout=PEERING_LIFETIME + 60,
        )
        # the API server logs a write's audit event after it committed it: the Job can be read a moment
        # before the standby's create is in the log
        try:
            taken = wait_for(
                lambda: next(
                    (w for w, by, _ in acting_writes(cluster, release) if by == standby_name and w > killed),
                    None,
                ),
                what="the standby's first write after the kill in the audit log",
                timeout=30,
            )
        except AssertionError as exc:
            raise said(str(exc), acting_writes(cluster, release), killed) from None
        renewals = acting_writes(cluster, release, peering=True)
        # a standby that could not run or reach the API server (starved of CPU on this 2-core machine)
        # cannot take over meanwhile: the goal holds for the time it ran (its longest silence past the 2 s
        # renewal period is not counted)
        stalled = max(0.0, longest_silence(renewals, standby_name, killed, taken) - 2 * RENEW_SECONDS)
        print(
            f"standby took over {taken - killed:.1f} s after the acting replica was killed "
            f"(it could not run for {stalled:.1f} s of it)"
        )
        if taken - killed > TAKEOVER_GOAL + stalled:
            raise said(
                f"took over {taken - killed:.1f} s after the kill", acting_writes(cluster, release), killed
            )
        for name in ("first", "second"):
            final = wait_phase(cluster, release.jobs, name, "Succeeded", "Failed", timeout=300)
            assert final["status"]["phase"] == "Succeeded", final["status"]
        # Never two acting, read again now that both jobs are done (a restarted leader container that acted
        # after the handover would show here): every change of the writing replica is a takeover from one
        # its peers saw dead, a stalled one waking, or one that yielded. Audit times are when the API server
        # received a write: one sent just before the SIGKILL can be received seconds later.
        # the killed container's restart is a replica of its own (a new peering identity, a new priority),
        # in the same pod: what its process wrote is told apart from what the killed one wrote
        restart = restarted_at(cluster, release.namespace, leader_name)
        writes, renewals = (
            [
                (when, f"{by} (restarted)" if by == leader_name and when >= restart else by, what)
                for when, by, what in got
            ]
            for got in (acting_writes(cluster, release), acting_writes(cluster, release, peering=True))
        )
        near = [(round(when - killed, 3), pod, what) for when, pod, what in writes if when > killed - 5]
        print("writes near the kill (s after it, operator pod, what):", *near, sep="\n  ")
        if unexplained := overlaps(writes, renewals, PEERING_LIFETIME):
            raise said(f"two acting: {unexplained}", writes, killed)


def longest_silence(renewals: list[tuple[float, str, str]], pod: str, start: float, end: float) -> float:
    """The longest time between ``start`` and ``end`` in which ``pod`` wrote nothing to the peering object,
    counted from its first peering write (before that it was not yet a replica, not a silent one); 0 for a
    pod that had not written to it by ``end``."""
    own = sorted(when for when, by, _ in renewals if by == pod)
    if not own or own[0] >= end:
        return 0.0
    start = max(start, own[0])
    times = sorted([start, end, *(when for when in own if start < when < end)])
    return max(b - a for a, b in itertools.pairwise(times))


def restarted_at(cluster: Cluster, namespace: str, pod: str) -> float:
    """When the operator container of ``pod`` running now could first have written: a second after the
    start its status gives (to the second, rounded down; the operator takes longer than that to start);
    infinity when the container was never restarted."""
    got = cluster.kubectl_json("get", "pod", "-n", namespace, pod)
    (status,) = [c for c in got["status"]["containerStatuses"] if c["name"] == "operator"]
    started = (status.get("state") or {}).get("running", {}).get("startedAt")
    if not status.get("restartCount") or not started:
        return float("inf")
    return dt.datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp() + 1


def _operator_logs(cluster: Cluster, namespace: str, pod: str) -> str:
    """The operator container's log, of its last run and (a restarted container) the one before."""
    out = []
    for previous in ("--previous=true", "--previous=false"):
        got = cluster.kubectl("logs", "-n", namespace, pod, "-c", "operator", previous, check=False)
        out.append(f"--- {pod} {previous}:\n{(got.stdout + got.stderr)[-6000:]}")
    return "\n".join(out)


def host_volume(name: str, namespace: str, claim: str, folder: Path, mode: str) -> dict[str, Any]:
    """A 1Gi hostPath PersistentVolume ``name`` on ``folder``, kept for claim ``namespace/claim`` alone."""
    volume = host_path_volume(name, "", str(folder))
    volume["spec"].update(accessModes=[mode], claimRef={"namespace": namespace, "name": claim})
    return volume


def shared_claim(namespace: str, name: str, folder: Path) -> list[dict[str, Any]]:
    """A ReadWriteMany hostPath PersistentVolume bound to claim ``name`` in ``namespace``, and the claim."""
    volume = host_volume(f"{name}-{namespace}", namespace, name, folder, "ReadWriteMany")
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": "",
            "volumeName": f"{name}-{namespace}",
        },
    }
    return [volume, claim]


def test_a_pod_security_refusal_is_said_naming_the_field_and_nothing_of_the_gang_exists(
    cluster: Cluster, release: Release
) -> None:
    """In the restricted namespace, a podTemplate with hostNetwork: the Job is created, the API server
    refuses its pods (the Job controller's FailedCreate events), and the DDPJob says so: Pending, reason
    PodSecurity, the API server's words and the field; no pod exists and no restart is spent."""
    doc = ddpjob("hostnet", podTemplate={**ON_REAL_NODES, "hostNetwork": True}, trainer={"steps": 10})
    cluster.kubectl("apply", "-n", release.jobs, "-f", "-", input=manifests(doc))

    def said() -> dict[str, Any] | None:
        status = get(cluster, release.jobs, "hostnet").get("status", {})
        ready = {c["type"]: c for c in status.get("conditions", [])}.get("Ready", {})
        return status if ready.get("reason") == "PodSecurity" else None

    try:
        status = wait_for(said, what="the DDPJob's Ready reason PodSecurity", timeout=120, every=1)
    except AssertionError as exc:
        told = cluster.kubectl("get", "events", "-n", release.jobs, "-o", "json", check=False).stdout
        last = get(cluster, release.jobs, "hostnet").get("status")
        raise AssertionError(f"{exc}; status: {last}; events: {told[-3000:]}") from None
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert status["phase"] == "Pending" and status.get("restarts", 0) == 0, status
    assert 'violates PodSecurity "restricted:latest"' in ready["message"], ready
    assert "host namespaces (hostNetwork=true)" in ready["message"], ready
    assert (
        'spec.podTemplate.hostNetwork: true is not allowed under Pod Security "restricted"'
        in (ready["message"])
    ), ready
    assert children(cluster, release.jobs, "pods", "hostnet") == []
    assert [e["type"] for e in events(cluster, release.jobs, "hostnet", "PodSecurity")] == ["Warning"]
    cluster.kubectl("delete", "ddpjob", "hostnet", "-n", release.jobs, "--wait=false")


def test_a_lost_real_node_restarts_the_gang_on_the_node_that_remains(
    cluster: Cluster, real_nodes: list[RealNode], release: Release, tmp_path: Path
) -> None:
    """As ``test_faults``' test of the same name, with a kubelet that stops renewing its Lease and
    containers that die with their node. The node lost is the one without the operator's pod."""
    folder = writable_folder(tmp_path / "ckpt")
    ns = release.jobs
    # the checkpoints on a claim (restricted refuses a hostPath volume in the pod): a ReadWriteMany volume
    # both kubelets mount, as a shared filesystem would be (both real nodes are this machine)
    cluster.kubectl("apply", "-f", "-", input=manifests(*shared_claim(ns, "lost-ckpt", folder)))
    doc = ddpjob(
        "lost",
        checkpoint={"volume": {"persistentVolumeClaim": {"claimName": "lost-ckpt"}}, "mountPath": "/ckpt"},
        trainer={"steps": 160, "checkpointEvery": 20},
        syncCheck={"everySteps": 20},
        nodeLostTolerationSeconds=10,
        podTemplate=ON_REAL_NODES,
    )
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=manifests(doc))
    wait_for(lambda: list(folder.glob("step-*.pt")), what="a checkpoint", timeout=300)
    operator_node = release.operator_pod()["spec"]["nodeName"]
    (node,) = [n for n in real_nodes if n.name != operator_node]
    assert any(p["spec"]["nodeName"] == node.name for p in children(cluster, ns, "pods", "lost"))
    try:
        realfixture.lose_node(node)
        status = wait_phase(cluster, ns, "lost", "Succeeded", "Failed", timeout=480)["status"]
        assert status["phase"] == "Succeeded", status
        assert status["attempt"] >= 2 and status["checkpoint"]["resumedFromStep"] > 0, status
        pods = children(cluster, ns, "pods", "lost")
        final = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        assert final and all(p["spec"]["nodeName"] == operator_node for p in final), final
    finally:
        realfixture.restore_node(cluster, node)
    wait_for(
        lambda: not [p for p in children(cluster, ns, "pods", "lost") if p["spec"]["nodeName"] == node.name],
        what=f"the pods left on {node.name} to be removed once it is back",
        timeout=90,
    )
