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
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_operator.runtime.lease import LEASE_DURATION_SECONDS, RETRY_PERIOD_SECONDS
from helpers.e2e import (
    ON_REAL_NODES,
    REPO,
    children,
    container_pid,
    events,
    get,
    newest_step,
    wait_phase,
    writable_folder,
)
from helpers.e2e_pods import cut_network
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
# seconds from the loss to the standby's first write: today's 12 s, and its Kopf's start and first reconcile
TAKEOVER_GOAL = 12 + 5


def acting_writes(cluster: Cluster, release: Release, lease: bool = False) -> list[tuple[float, str, str]]:
    """(time, operator pod, what) of every write the release's operator made but its refused Lease writes
    (``lease``: only those to its Lease), from the API server's audit log: each by the pod whose
    bound token made it, at the time the API server received it."""
    user = f"system:serviceaccount:{release.namespace}:{release.service_account}"
    out = []
    for event in audit_events(cluster, user):
        ref = event.get("objectRef") or {}
        if event["verb"] not in ("create", "update", "patch", "delete"):
            continue
        if lease and ref.get("resource") != "leases":
            continue
        if ref.get("resource") == "leases" and event["responseStatus"].get("code", 200) >= 400:
            continue  # a standby's refused take (409): a candidate, not an acting replica
        when = dt.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
        pod = ((event["user"].get("extra") or {}).get(POD_NAME) or ["?"])[0]
        what = f"{event['verb']} {ref.get('resource')}/{ref.get('subresource', '')} {ref.get('name', '')}"
        out.append((when, pod, what))
    return sorted(out)


def interleaved(writes: list[tuple[float, str, str]]) -> list[str]:
    """Strictly, with no grace window: each write by a replica after another replica had written since
    its own last one (a replica that wrote, then another, then the first again: two acting)."""
    out, done = [], set()
    for (t_a, a, _), (t_b, b, what) in itertools.pairwise(writes):
        if a != b:
            done.add(a)
            if b in done:
                out.append(
                    f"{b} wrote ({what}) at {t_b:.3f}, after {a} had taken over (its write at {t_a:.3f})"
                )
    return out


def test_a_standby_operator_takes_over_within_the_lease_and_never_two_act(
    cluster: Cluster, real_nodes: list[RealNode]
) -> None:
    """replicaCount 2: both operator pods run, one acts (the Lease's holder). Its process is SIGKILLed on
    its node (a death without a word: the Lease stays until the standby has seen it unrenewed for its
    duration); a DDPJob applied at that moment is taken up by the standby and Succeeds. The audit log shows
    one writer before the kill, and every write of the killed process received before the standby's first,
    with no grace window: never two acting. Then `helm upgrade` with both replicas (a new pod template):
    a clean handover, the running job's pods kept, still never two acting."""
    # The operator pods request half a CPU, as much as a trainer process here, so that the trainers that
    # saturate this machine's 2 cores do not starve them (a stalled holder is what no lease can fence:
    # docs/operator.md, "A stalled replica").
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

        writes = acting_writes(cluster, release)
        if len({by for _, by, _ in writes}) != 1:
            raise said("two wrote before any kill", writes, writes[0][0])
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
            timeout=TAKEOVER_GOAL + 60,
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
        print(f"standby took over {taken - killed:.1f} s after the acting replica was killed")
        if taken - killed > TAKEOVER_GOAL:
            raise said(
                f"took over {taken - killed:.1f} s after the kill", acting_writes(cluster, release), killed
            )
        for name in ("first", "second"):
            final = wait_phase(cluster, release.jobs, name, "Succeeded", "Failed", timeout=300)
            assert final["status"]["phase"] == "Succeeded", final["status"]
        # Never two acting, read again now that both jobs are done (a restarted leader container that acted
        # after the handover would show here). The killed container's restart is a candidate of its own (a
        # new holder identity: it stands by), in the same pod: what its process wrote is told apart.
        restart = restarted_at(cluster, release.namespace, leader_name)
        writes = [
            (when, f"{by} (restarted)" if by == leader_name and when >= restart else by, what)
            for when, by, what in acting_writes(cluster, release)
        ]
        near = [(round(when - killed, 3), pod, what) for when, pod, what in writes if when > killed - 5]
        print("writes near the kill (s after it, operator pod, what):", *near, sep="\n  ")
        old = [when for when, by, _ in writes if by == leader_name]
        new = [when for when, by, _ in writes if by == standby_name and when > killed]
        if max(old) >= min(new):  # strictly: no grace window
            raise said("the killed replica's write was received after the standby's first", writes, killed)
        if first_lease := [
            w for w, by, _ in acting_writes(cluster, release, lease=True) if by == standby_name
        ]:
            # the standby judged the Lease expired on its own clock: a duration after the last renewal
            last_renewal = max(
                w for w, by, _ in acting_writes(cluster, release, lease=True) if by == leader_name
            )
            assert first_lease[0] - last_renewal >= LEASE_DURATION_SECONDS - RETRY_PERIOD_SECONDS / 10, near
        if two := interleaved(writes):
            raise said(f"two acting: {two}", writes, killed)

        # helm upgrade with 2 replicas, a new pod template: Recreate stops both pods (the holder releases the
        # Lease), the new ones start and one takes it at once; the running job keeps its pods, no restart
        third = ddpjob("third", trainer={"steps": 1500, "batchSize": 16}, podTemplate=ON_REAL_NODES)
        cluster.kubectl("apply", "-n", release.jobs, "-f", "-", input=manifests(third))
        wait_phase(cluster, release.jobs, "third", "Running", timeout=180)
        kept = {p["metadata"]["uid"] for p in children(cluster, release.jobs, "pods", "third")}
        old_pods = {
            p["metadata"]["name"]
            for p in cluster.kubectl_json("get", "pods", "-n", release.namespace, "-l", release.selector)[
                "items"
            ]
        }
        upgraded = time.time()
        release.upgrade(**{"resources.requests.cpu": "450m"})
        handed = wait_for(
            lambda: next(
                (w for w, by, _ in acting_writes(cluster, release) if w > upgraded and by not in old_pods),
                None,
            ),
            what="a new operator pod's first write after the upgrade",
            timeout=120,
        )
        final = wait_phase(cluster, release.jobs, "third", "Succeeded", "Failed", timeout=480)["status"]
        assert final["phase"] == "Succeeded" and (final["attempt"], final.get("restarts", 0)) == (1, 0), final
        assert kept <= {p["metadata"]["uid"] for p in children(cluster, release.jobs, "pods", "third")}, (
            "the upgrade replaced the running job's pods"
        )
        writes = [
            (when, f"{by} (restarted)" if by == leader_name and when >= restart else by, what)
            for when, by, what in acting_writes(cluster, release)
        ]
        old_last = max(w for w, by, _ in writes if by.split(" ")[0] in old_pods)
        print(f"helm upgrade: the new pods' first write {handed - old_last:.1f} s after the old ones' last")
        if two := interleaved(writes):
            raise said(f"two acting across the upgrade: {two}", writes, upgraded)


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


RIGID_SILENT_BOUND_SECONDS = 60.0
"""Issue 54 item 3: a rigid job's silent pod to its gang restart, with every timeout at its default."""


def test_a_lost_real_node_restarts_the_gang_on_the_node_that_remains(
    cluster: Cluster, real_nodes: list[RealNode], release: Release, tmp_path: Path
) -> None:
    """As ``test_faults``' test of the same name, with a kubelet that stops renewing its Lease and
    containers that die with their node. The node lost is the one without the operator's pod. Before it is
    lost, the same rigid job meets a silent pod (issue 54 item 3): its pod on that node cut off from the
    network, its processes running and its node Ready; with ``stallTimeoutSeconds`` and
    the NCCL timeout at their defaults, the gang restart starts within 60 s of the cut, and its
    reason names the silent pod and its node."""
    folder = writable_folder(tmp_path / "ckpt")
    ns = release.jobs
    # the checkpoints on a claim (restricted refuses a hostPath volume in the pod): a ReadWriteMany volume
    # both kubelets mount, as a shared filesystem would be (both real nodes are this machine)
    cluster.kubectl("apply", "-f", "-", input=manifests(*shared_claim(ns, "lost-ckpt", folder)))
    doc = ddpjob(
        "lost",
        checkpoint={"volume": {"persistentVolumeClaim": {"claimName": "lost-ckpt"}}, "mountPath": "/ckpt"},
        trainer={"steps": 400, "checkpointEvery": 20},
        syncCheck={"everySteps": 20},
        nodeLostTolerationSeconds=10,  # for the lost node; the cut pod's node stays Ready, so it never counts
        podTemplate=ON_REAL_NODES,
    )
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=manifests(doc))
    wait_for(lambda: list(folder.glob("step-*.pt")), what="a checkpoint", timeout=300)
    operator_node = release.operator_pod()["spec"]["nodeName"]
    (node,) = [n for n in real_nodes if n.name != operator_node]
    attempt_1 = children(cluster, ns, "pods", "lost")
    (cut,) = [p for p in attempt_1 if p["spec"]["nodeName"] == node.name]
    cut_at = time.monotonic()

    def restarting() -> bool:  # the operator decided: it stops attempt 1's pods (or attempt 2 is there)
        status = get(cluster, ns, "lost")["status"]
        return status.get("phase") == "Restarting" or status.get("attempt", 1) >= 2

    with cut_network(real_nodes, cut):
        try:
            wait_for(
                restarting,
                what=f"a gang restart within {RIGID_SILENT_BOUND_SECONDS:.0f} s of the cut",
                timeout=RIGID_SILENT_BOUND_SECONDS,
                every=0.5,
            )
        except AssertionError as exc:
            logs = {
                p["metadata"]["name"]: cluster.kubectl("logs", "-n", ns, p["metadata"]["name"], check=False)
                for p in attempt_1
            }
            tails = "\n".join(f"--- {k}:\n{(v.stdout + v.stderr)[-3000:]}" for k, v in logs.items())
            raise AssertionError(
                f"{exc}\ncut: {cut['metadata']['name']}\n{get(cluster, ns, 'lost')['status']}\n{tails}"
            ) from None
        restarting_in = time.monotonic() - cut_at
        # the cut pod acts on its SIGTERM only at a step boundary its cut-off workers never reach: attempt 2
        # comes once its grace period (30 s) ends
        wait_for(
            lambda: get(cluster, ns, "lost")["status"].get("attempt", 1) >= 2,
            what="attempt 2, once attempt 1's pods stopped",
            timeout=120,
            every=0.5,
        )
        restarted_in = time.monotonic() - cut_at
    bound = RIGID_SILENT_BOUND_SECONDS
    print(
        f"rigid job, network cut → gang restart: {restarting_in:.1f} s (bound {bound:.0f} s); "
        f"attempt 2: {restarted_in:.1f} s"
    )

    def naming() -> str | None:  # Kopf posts events after the status, in the background
        found = cluster.kubectl_json(
            "get", "events", "-n", ns, "--field-selector", "involvedObject.name=lost"
        )["items"]
        return next((str(e["message"]) for e in found if "went silent" in str(e.get("message", ""))), None)

    reason = wait_for(naming, what="the restart's event naming the silent peer", timeout=30)
    # a cut is a partition: each side hears nothing from the other, so whichever pod's report came first
    # names the other; either way the reason names a pod of the gang by its host name, with its own node
    named = [
        (host, where)
        for host, where in ((str(p["spec"].get("hostname", "")), p["spec"]["nodeName"]) for p in attempt_1)
        if host and re.search(re.escape(host) + r"\S* \([^()]*, on node " + re.escape(where) + r"\)", reason)
    ]
    assert named, ([(p["spec"].get("hostname"), p["spec"]["nodeName"]) for p in attempt_1], reason)
    print(f"the restart's reason names {named}: {reason}")
    # the lost node, once attempt 2 trains on both nodes again
    saved = newest_step(folder)
    wait_for(lambda: newest_step(folder) > saved, what=f"a checkpoint past step {saved}", timeout=180)
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
