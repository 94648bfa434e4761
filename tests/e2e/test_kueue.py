"""Queued for real: Kueue v0.17 (built from its module, testcluster/kueue.py) admits, holds, preempts and
requeues DDPJobs on the test cluster, with the objects a user of a shared cluster writes: a ResourceFlavor,
a ClusterQueue with quota, a LocalQueue in the namespace, a WorkloadPriorityClass.

Each test has its own ClusterQueue (named after its namespace) whose CPU quota fits exactly one DDPJob of
2 pods x 500m: the default request per process. The pods run on the real nodes (2 CPUs each)."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_operator.observe.workloads import SLICE_REPLACES
from helpers import slow_factories
from helpers.e2e import (
    SCRIPTS,
    Operator,
    children,
    container_pid,
    ddpjob,
    events,
    get,
    real_ddpjob,
    session_operator_paused,
    wait_phase,
)
from helpers.e2e_pods import durable_job, events_text, pod_at, rank_process
from testcluster import kueue
from testcluster.fixtures import Cluster, wait_for
from testcluster.nodeconfig import RealNode

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
KUEUE = "kueue.x-k8s.io/v1beta2"


@pytest.fixture(scope="module")
def kueue_running(cluster: Cluster) -> Iterator[None]:
    """Kueue for this module only: the rest of the e2e tier runs without its webhooks. The session's
    operator starts again once Kueue's CRDs are served: Kopf rescans a group on each of its CRD events and
    can miss Workloads when their CRD is served a moment after its last event (seen here: no
    status.kueue), so an operator started before Kueue would not see Workloads until it restarts."""
    with session_operator_paused():
        kueue.start(cluster.layout)
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump_all(
            [
                {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": "default-flavor"}},
                {
                    "apiVersion": KUEUE,
                    "kind": "WorkloadPriorityClass",
                    "metadata": {"name": "urgent"},
                    "value": 1000,
                },
            ]
        ),
    )
    try:
        yield
    finally:
        kueue.stop(cluster.layout)


def _queues(cluster: Cluster, namespace: str, cpu: str = "1") -> str:
    """A ClusterQueue with ``cpu`` of quota (preempting lower priorities) and its LocalQueue; returns the
    LocalQueue's name."""
    objects = [
        {
            "apiVersion": KUEUE,
            "kind": "ClusterQueue",
            "metadata": {"name": namespace},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [
                            {
                                "name": "default-flavor",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": cpu},
                                    {"name": "memory", "nominalQuota": "64Gi"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": KUEUE,
            "kind": "LocalQueue",
            "metadata": {"name": "team", "namespace": namespace},
            "spec": {"clusterQueue": namespace},
        },
    ]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
    return "team"


def _apply(cluster: Cluster, namespace: str, doc: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))


def _ready(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    conditions = get(cluster, namespace, name).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "Ready"), {})


def _reason_is(
    cluster: Cluster, namespace: str, name: str, reason: str, timeout: float = 120, says: str = ""
) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        ready = _ready(cluster, namespace, name)
        return ready if ready.get("reason") == reason and says in ready.get("message", "") else None

    try:
        return wait_for(reached, what=f"DDPJob {name}'s Ready reason {reason}", timeout=timeout, every=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last status: {get(cluster, namespace, name).get('status')}") from None


def _workload(cluster: Cluster, namespace: str, job: str) -> dict[str, Any]:
    (found,) = [
        w
        for w in cluster.kubectl_json("get", "workloads", "-n", namespace)["items"]
        if w["metadata"]["ownerReferences"][0]["name"] == job
    ]
    return found


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def _seconds(since: str, until: str) -> float:
    parse = dt.datetime.fromisoformat
    return (parse(until.replace("Z", "+00:00")) - parse(since.replace("Z", "+00:00"))).total_seconds()


def test_with_quota_for_one_job_the_second_waits_saying_why_and_starts_when_the_first_finishes(
    cluster: Cluster, operator: Operator, kueue_running: None, namespace: str, real_nodes: list[RealNode]
) -> None:
    queue = _queues(cluster, namespace)
    short = {"trainer": {"steps": 300, "batchSize": 16}}  # the first holds the quota for 15 s or more
    _apply(cluster, namespace, real_ddpjob("first", queueName=queue, **short))
    wait_phase(cluster, namespace, "first", "Running", timeout=120)
    _apply(cluster, namespace, real_ddpjob("second", queueName=queue, **short))
    # KueuePending from the start; Kueue's quota message once its scheduler has tried the Workload
    ready = _reason_is(cluster, namespace, "second", "KueuePending", says="insufficient unused quota")
    assert get(cluster, namespace, "second")["status"]["phase"] == "Pending"
    message = ready["message"]
    assert f"LocalQueue {queue}" in message and "Kueue" in message, message
    assert "insufficient unused quota for cpu in flavor default-flavor" in message, message
    (job,) = children(cluster, namespace, "jobs", "second")
    assert job["spec"]["suspend"] is True and not children(cluster, namespace, "pods", "second")
    row = cluster.kubectl("get", "ddpj", "second", "-n", namespace, "-o", "wide").stdout
    assert "KueuePending" in row and "insufficient unused quota" in row, row
    print(row)

    first = wait_phase(cluster, namespace, "first", "Succeeded", "Failed", timeout=300)["status"]
    assert first["phase"] == "Succeeded" and first["kueue"]["admitted"] is True, first
    second = wait_phase(cluster, namespace, "second", "Succeeded", "Failed", timeout=300)["status"]
    assert second["phase"] == "Succeeded" and second["restarts"] == 0, second
    created = get(cluster, namespace, "first")["metadata"]["creationTimestamp"]
    admitted = _condition(_workload(cluster, namespace, "first-1"), "Admitted")["lastTransitionTime"]
    print(
        "admission latency (DDPJob created -> Workload admitted, 1 s resolution): "
        f"{_seconds(created, admitted):.0f} s"
    )


def test_a_higher_priority_job_preempts_a_running_one_which_checkpoints_waits_and_resumes(
    cluster: Cluster,
    operator: Operator,
    kueue_running: None,
    namespace: str,
    real_nodes: list[RealNode],
    tmp_path: Path,
) -> None:
    queue = _queues(cluster, namespace)
    folder = tmp_path / "ckpt"
    trainer = {"steps": 600, "batchSize": 16, "checkpointEvery": 20}
    _apply(cluster, namespace, real_ddpjob("low", queueName=queue, **durable_job(folder, trainer=trainer)))
    wait_for(lambda: list(folder.glob("step-*.pt")), what="a checkpoint of the low-priority job", timeout=240)
    workload_uid = _workload(cluster, namespace, "low-1")["metadata"]["uid"]
    urgent = {"steps": 60, "batchSize": 16}
    _apply(
        cluster,
        namespace,
        real_ddpjob("urgent", queueName=queue, workloadPriorityClassName="urgent", trainer=urgent),
    )

    ready = _reason_is(cluster, namespace, "low", "KueuePreempted")
    status = get(cluster, namespace, "low")["status"]
    assert status["phase"] == "Pending" and "preempted by Kueue" in ready["message"], status
    assert "Preempted to accommodate a workload" in ready["message"], ready
    assert (status["attempt"], status["restarts"], status.get("preemptions")) == (1, 0, None), status
    (job,) = children(cluster, namespace, "jobs", "low")
    wait_for(
        lambda: not children(cluster, namespace, "pods", "low"), what="the preempted pods to stop", timeout=90
    )
    said = events(cluster, namespace, "low", "KueuePreempted")
    assert said and said[0]["type"] == "Warning", said

    assert (
        wait_phase(cluster, namespace, "urgent", "Succeeded", "Failed", timeout=300)["status"]["phase"]
        == "Succeeded"
    )
    done = wait_phase(cluster, namespace, "low", "Succeeded", "Failed", timeout=400)["status"]
    assert done["phase"] == "Succeeded", done
    assert (done["attempt"], done["restarts"]) == (1, 0), "a preemption by Kueue is no restart"
    assert done["checkpoint"]["resumedFromStep"] > 0 and done["sync"]["verified"] is True, done
    assert done["kueue"]["evictions"] == 1 and done["kueue"]["admitted"] is True, done
    assert _workload(cluster, namespace, "low-1")["metadata"]["uid"] == workload_uid, (
        "the same Workload resumed"
    )
    (after,) = children(cluster, namespace, "jobs", "low")
    assert after["metadata"]["uid"] == job["metadata"]["uid"], "the same Job, unsuspended"


def test_a_queue_name_that_names_no_local_queue_is_said_and_nothing_spins(
    cluster: Cluster, operator: Operator, kueue_running: None, namespace: str, real_nodes: list[RealNode]
) -> None:
    _apply(cluster, namespace, real_ddpjob("lost", queueName="no-such-queue"))
    ready = _reason_is(cluster, namespace, "lost", "KueueInadmissible")
    assert "LocalQueue no-such-queue doesn't exist" in ready["message"], ready
    before = get(cluster, namespace, "lost")["metadata"]["resourceVersion"]
    time.sleep(12)  # what is measured: more than two of the operator's 5 s timer rounds without a write
    after = get(cluster, namespace, "lost")
    assert after["metadata"]["resourceVersion"] == before, "the status was written again with nothing new"
    assert len(children(cluster, namespace, "jobs", "lost")) == 1 and not children(
        cluster, namespace, "pods", "lost"
    )
    said = events(cluster, namespace, "lost", "KueueInadmissible")
    assert [e.get("count", 1) for e in said] == [1], said


def test_a_bad_queue_name_is_refused_at_apply(cluster: Cluster, operator: Operator, namespace: str) -> None:
    refused = cluster.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps(ddpjob("bad", queueName="Team Queue!")),
        check=False,
    )
    assert refused.returncode != 0 and "spec.queueName" in refused.stderr, refused.stderr
    alone = ddpjob("alone", workloadPriorityClassName="urgent")
    refused = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(alone), check=False)
    assert refused.returncode != 0 and "needs queueName" in refused.stderr, refused.stderr


def test_a_restart_in_place_keeps_the_admission_and_a_replaced_job_is_admitted_again(
    cluster: Cluster,
    operator: Operator,
    kueue_running: None,
    namespace: str,
    real_nodes: list[RealNode],
    tmp_path: Path,
) -> None:
    """A rank SIGKILLed in its container: the same pods (same UIDs) restart every rank in place, resume from
    the checkpoint and are verified again; the status shows one restart in place with its cause, an event
    says it, and Kueue's Workload stays admitted through it. Then a pod deleted: that still takes the
    Job-recreation path (attempt 2), whose new Workload Kueue admits again, and the job Succeeds with both
    restarts counted. On the way: ``spec.shmSize`` is the size of the container's /dev/shm. (One scenario
    for what test_faults.py and this file each proved with a start-up of their own.)"""
    queue = _queues(cluster, namespace)
    folder = tmp_path / "ckpt"
    # the tests' slow model (30 ms a forward, its module in the scripts folder mounted in the pods) until the
    # gate in the checkpoint folder opens, once attempt 2 is admitted: on an idle machine the built-in MLP
    # trained its 900 steps before the pod's deletion (seen alone: no attempt 2, the job Succeeded)
    gate = folder / "fast"
    trainer = {"steps": 2000, "batchSize": 16, "checkpointEvery": 50, "model": "slow_factories:slow_mlp"}
    env = [
        {"name": "PYTHONPATH", "value": str(SCRIPTS)},
        {"name": slow_factories.FAST_AFTER_ENV, "value": str(gate)},
    ]
    spec = durable_job(folder, trainer=trainer)
    doc = real_ddpjob(
        "steady",
        queueName=queue,
        syncCheck={"everySteps": 50},
        shmSize="512Mi",
        scripts=True,
        env=env,
        **spec,
    )
    _apply(cluster, namespace, doc)
    wait_for(lambda: list(folder.glob("step-*.pt")), what="a checkpoint", timeout=240)
    workload = _workload(cluster, namespace, "steady-1")
    admitted_at = _condition(workload, "Admitted")["lastTransitionTime"]
    pods = {
        p["metadata"]["name"]: p["metadata"]["uid"] for p in children(cluster, namespace, "pods", "steady")
    }
    victim = pod_at(cluster, namespace, "steady", 1)
    # spec.shmSize: a memory emptyDir at /dev/shm, which the kubelet mounts as a tmpfs of that size
    mounts = Path(f"/proc/{container_pid(real_nodes, victim)}/mountinfo").read_text().splitlines()
    (shm,) = [m.split() for m in mounts if m.split()[4] == "/dev/shm"]
    assert shm[-3] == "tmpfs" and "size=524288k" in shm[-1], shm
    os.kill(rank_process(real_nodes, victim), signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        status = get(cluster, namespace, "steady").get("status", {})
        return status if status.get("restartsInPlace") == 1 else None

    try:
        status = wait_for(restarted, what="the operator to count a restart in place", timeout=90, every=1)
    except AssertionError as exc:  # how the attempt went instead: its status and events say
        said = get(cluster, namespace, "steady").get("status", {})
        raise AssertionError(
            f"{exc}; status: {json.dumps(said)}; events:\n{events_text(cluster, namespace, 'steady')}"
        ) from None
    assert (status["attempt"], status["restarts"]) == (1, 1), status
    last = status["lastRestart"]
    assert last["kind"] == "InPlace" and "rank 1 killed by signal 9" in last["message"], last
    now = {
        p["metadata"]["name"]: p["metadata"]["uid"] for p in children(cluster, namespace, "pods", "steady")
    }
    assert now == pods, "the pods were replaced: the restart was not in place"
    said = events(cluster, namespace, "steady", "RestartedInPlace")
    assert said and "rank 1 killed by signal 9" in said[0]["message"], said
    log = cluster.logs(namespace, pod_at(cluster, namespace, "steady", 0)["metadata"]["name"])
    assert "[launcher] gang restart in place 1" in log and "restored step-" in log, log[-2000:]
    print(f"in place: {last['message']}")
    again = _workload(cluster, namespace, "steady-1")
    assert again["metadata"]["uid"] == workload["metadata"]["uid"]
    assert _condition(again, "Admitted") | {"observedGeneration": 0} == _condition(workload, "Admitted") | {
        "observedGeneration": 0
    }, "the Workload stayed admitted through the restart in place"
    assert _condition(again, "Admitted")["lastTransitionTime"] == admitted_at

    cluster.kubectl(
        "delete", "pod", "-n", namespace, pod_at(cluster, namespace, "steady", 0)["metadata"]["name"]
    )
    wait_for(
        lambda: cluster.kube.get_or_none(f"/apis/batch/v1/namespaces/{namespace}/jobs/steady-2"),
        what="the Job of attempt 2",
        timeout=120,
    )
    replaced = wait_for(
        lambda: next(
            (
                w
                for w in cluster.kubectl_json("get", "workloads", "-n", namespace)["items"]
                if w["metadata"]["ownerReferences"][0]["name"] == "steady-2"
                and _condition(w, "Admitted").get("status") == "True"
            ),
            None,
        ),
        what="Kueue to admit attempt 2's Workload",
        timeout=120,
    )
    job2 = cluster.kube.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/steady-2")
    latency = _seconds(
        job2["metadata"]["creationTimestamp"], _condition(replaced, "Admitted")["lastTransitionTime"]
    )
    print(
        f"attempt 2: a new Job and a new Workload {replaced['metadata']['name']}, "
        f"admitted {latency:.0f} s after its Job"
    )
    gate.touch()  # the rest at full speed
    done = wait_phase(cluster, namespace, "steady", "Succeeded", "Failed", timeout=400)["status"]
    assert done["phase"] == "Succeeded", done
    assert (done["attempt"], done["restarts"], done["restartsInPlace"]) == (2, 2, 1), done
    assert done["lastRestart"]["kind"] == "Recreate" and done["sync"]["verified"] is True, done
    assert (
        done["kueue"]["workload"] == replaced["metadata"]["name"]
        and done["checkpoint"]["resumedFromStep"] > 0
    )


def test_wait_for_pods_ready_requeues_a_gang_that_cannot_all_start(
    cluster: Cluster, operator: Operator, kueue_running: None, namespace: str, real_nodes: list[RealNode]
) -> None:
    """Kueue with ``waitForPodsReady`` (20 s): three pods of 1.5 CPUs on two real nodes of 2 CPUs each
    cannot all run; Kueue evicts the Workload, suspends the Job and requeues it, and the DDPJob says so."""
    kueue.start(cluster.layout, pods_ready_timeout=20)
    try:
        queue = _queues(cluster, namespace, cpu="4500m")
        _apply(
            cluster,
            namespace,
            real_ddpjob("wide", nodes=3, queueName=queue, resources={"requests": {"cpu": "1500m"}}),
        )
        _reason_is(cluster, namespace, "wide", "Unschedulable", timeout=60)
        # Kueue requeues it after a 1 s backoff, so the reason may last a moment: its Warning event stays.
        (said,) = wait_for(
            lambda: events(cluster, namespace, "wide", "KueueRequeued") or None,
            what="the DDPJob to say Kueue requeued it",
            timeout=90,
        )
        assert said["type"] == "Warning" and "requeued by Kueue" in said["message"], said
        assert "PodsReady timeout" in said["message"], said
        status = get(cluster, namespace, "wide")["status"]
        assert status["attempt"] == 1 and status["restarts"] == 0, "a requeue by Kueue is no restart"
        assert status["kueue"]["evictions"] >= 1 and status["phase"] == "Pending", status
        cluster.kubectl("delete", "ddpjob", "wide", "-n", namespace, "--wait=true", "--timeout=60s")
    finally:
        kueue.start(cluster.layout)  # the module's Kueue again, without waitForPodsReady


SLICE_GATE = "kueue.x-k8s.io/elastic-job"


def _world_of(cluster: Cluster, namespace: str, name: str, nodes: int) -> dict[str, Any] | None:
    """The DDPJob's status once it says ``nodes`` train (``status.elastic.nodes``)."""
    status: dict[str, Any] = get(cluster, namespace, name).get("status", {})
    return status if (status.get("elastic") or {}).get("nodes") == nodes else None


def _pods_said(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    """Each pod of the DDPJob ``name`` as a failure should name it: its phase, node, scheduling gates and
    conditions that are not true (why it waits)."""
    return [
        {
            "pod": pod["metadata"]["name"],
            "phase": pod.get("status", {}).get("phase"),
            "node": pod["spec"].get("nodeName"),
            "gates": [gate["name"] for gate in pod["spec"].get("schedulingGates") or []],
            "waiting": [
                f"{c['type']}: {c.get('reason', '')} {c.get('message', '')}".strip()
                for c in pod.get("status", {}).get("conditions") or []
                if c.get("status") != "True"
            ],
        }
        for pod in children(cluster, namespace, "pods", name)
    ]


def _cpu_reserved(cluster: Cluster, queue: str) -> str:
    """The CPU the ClusterQueue ``queue`` has reserved now (its ``status.flavorsReservation``)."""
    status = cluster.kubectl_json("get", "clusterqueue", queue).get("status", {})
    for flavor in status.get("flavorsReservation") or []:
        for resource in flavor.get("resources") or []:
            if resource["name"] == "cpu":
                return str(resource.get("total", "0"))
    return "0"


def test_an_elastic_scale_up_waits_for_its_slice_while_the_world_trains_on_and_a_scale_down_frees_quota(
    cluster: Cluster, operator: Operator, kueue_running: None, namespace: str, tmp_path: Path
) -> None:
    """Kueue's ElasticJobsViaWorkloadSlices with an elastic DDPJob (issue 42, item 10): quota for 2 pods.
    `kubectl scale --replicas=3` makes a new Workload slice that waits for quota; the third pod waits behind
    Kueue's scheduling gate and the DDPJob says why in Kueue's words while the 2 pods train on. Quota raised:
    the slice is admitted, the gate lifts, the world grows to 3. `--replicas=2`: the Workload shrinks in
    place and the ClusterQueue frees the quota at once. One Job, one attempt, no restart; Succeeded,
    verified. The pods run on the node agents (a slow model, so that it trains through all of it)."""
    queue = _queues(cluster, namespace)  # 1 CPU: 2 pods x 500m
    slow = {"name": "PYTHONPATH", "value": str(Path(__file__).parents[1] / "helpers")}  # slow_factories
    gate = tmp_path / "fast"  # opened once the scale-down freed the quota: the rest at full speed
    fast = {"name": slow_factories.FAST_AFTER_ENV, "value": str(gate)}  # the node agents: on this host
    doc = ddpjob(
        "elastic",
        nodes=2,
        queueName=queue,
        elastic={"minNodes": 1, "maxNodes": 3},
        env=[slow, fast],
        trainer={"steps": 800, "batchSize": 16, "checkpointEvery": 20, "model": "slow_factories:slow_mlp"},
        syncCheck={"everySteps": 50},
    )
    _apply(cluster, namespace, doc)
    try:
        wait_for(
            lambda: _world_of(cluster, namespace, "elastic", 2),
            what="the elastic job admitted and training at 2 nodes",
            timeout=180,
        )
    except AssertionError as exc:  # once (a full run): admitted, unsuspended, its pods never scheduled
        raise AssertionError(f"{exc}; its pods: {_pods_said(cluster, namespace, 'elastic')}") from None
    (job,) = children(cluster, namespace, "jobs", "elastic")
    assert job["metadata"]["annotations"][SLICE_GATE] == "true"

    cluster.kubectl("scale", "ddpjob", "elastic", "-n", namespace, "--replicas=3")
    ready = _reason_is(cluster, namespace, "elastic", "BelowDesired", says="insufficient unused quota")
    message = ready["message"]
    assert message.startswith("2/3 pods ready; the new pods wait behind Kueue's scheduling gate"), message
    assert f"LocalQueue {queue}" in message and "cpu in flavor default-flavor" in message, message
    (pending,) = [
        p
        for p in children(cluster, namespace, "pods", "elastic")
        if p["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index") == "2"
    ]
    assert {g["name"] for g in pending["spec"].get("schedulingGates") or []} == {SLICE_GATE}, pending["spec"]
    status = get(cluster, namespace, "elastic")["status"]
    assert status["phase"] == "Running" and status["elastic"]["nodes"] == 2, status
    slices = [w for w in cluster.kubectl_json("get", "workloads", "-n", namespace)["items"]]
    waiting = [w for w in slices if (w["metadata"].get("annotations") or {}).get(SLICE_REPLACES)]
    assert len(slices) == 2 and len(waiting) == 1, [w["metadata"] for w in slices]
    assert status["kueue"]["workload"] == waiting[0]["metadata"]["name"] and not status["kueue"]["admitted"]
    print(message)

    _queues(cluster, namespace, cpu="1500m")  # capacity returns
    grown = wait_for(
        lambda: _world_of(cluster, namespace, "elastic", 3),
        what="the slice admitted and the world grown to 3",
        timeout=180,
    )
    assert grown["attempt"] == 1 and grown["restarts"] == 0, grown
    assert not [
        p for p in children(cluster, namespace, "pods", "elastic") if p["spec"].get("schedulingGates")
    ]
    replaced = _condition(
        next(
            w
            for w in cluster.kubectl_json("get", "workloads", "-n", namespace)["items"]
            if w["metadata"]["name"] != waiting[0]["metadata"]["name"]
        ),
        "Finished",
    )
    assert replaced.get("reason") == "WorkloadSliceReplaced", replaced
    wait_for(
        lambda: _cpu_reserved(cluster, namespace) == "1500m",
        what="the ClusterQueue to reserve the grown slice's 1500m",
        timeout=60,
        every=0.5,
    )

    scaled = time.monotonic()
    cluster.kubectl("scale", "ddpjob", "elastic", "-n", namespace, "--replicas=2")
    wait_for(
        lambda: _cpu_reserved(cluster, namespace) in ("1", "1000m"),
        what="the quota freed by the scale-down",
        timeout=60,
        every=0.5,
    )
    print(
        f"scale-down to 2: the ClusterQueue reserves 1 CPU {time.monotonic() - scaled:.1f} s after the scale"
    )
    gate.touch()
    done = wait_phase(cluster, namespace, "elastic", "Succeeded", "Failed", timeout=400)["status"]
    print(f"the scale-down → {done['phase']}: {time.monotonic() - scaled:.0f} s")
    assert done["phase"] == "Succeeded" and done["attempt"] == 1 and done["restarts"] == 0, done
    assert done["sync"]["verified"] is True and done["elastic"]["resizes"] >= 2, done
    assert [j["metadata"]["uid"] for j in children(cluster, namespace, "jobs", "elastic")] == [
        job["metadata"]["uid"]
    ]
