"""An elastic DDPJob that loses a node (issue 42, item 3, in a cluster): the attempt does not fail, the
others train on at the smaller world, and the Job replaces the lost pod instead of failing."""

from __future__ import annotations

import datetime as dt
from typing import Any

from ddp_operator.children import render
from ddp_operator.decide import decision
from ddp_operator.observe import workloads
from helpers.reconciling import NOW, ddpjob_body, job_object, observed, pod_object, spec_of

ELASTIC = {"elastic": {"minNodes": 1, "maxNodes": 2}}
ELASTIC_3 = {"elastic": {"minNodes": 1, "maxNodes": 3}}


def _evicted_from_lost_node(pod: dict[str, Any]) -> dict[str, Any]:
    """As the taint-eviction controller leaves it: deleted, with DisruptionTarget; the node never answers."""
    pod["metadata"]["deletionTimestamp"] = (NOW + dt.timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    pod["status"]["conditions"] = [
        {"type": "Ready", "status": "False"},
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"},
    ]
    return pod


def test_a_lost_node_does_not_end_an_elastic_attempt_while_min_nodes_train() -> None:
    previous = {"phase": "Running", "attempt": 1}
    pods = [pod_object(1, 0), _evicted_from_lost_node(pod_object(1, 1))]
    elastic = decision.decide(observed(ddpjob_body(previous, **ELASTIC), [job_object(1)], pods, NOW))
    assert elastic.status["phase"] == "Running" and elastic.status["attempt"] == 1, elastic.status
    ready = {c["type"]: c for c in elastic.status["conditions"]}["Ready"]
    assert ready["reason"] == "BelowDesired" and ready["message"] == "1/2 pods ready", ready
    assert elastic.delete_jobs == () and elastic.create_job is None  # no gang restart
    rigid = decision.decide(observed(ddpjob_body(previous), [job_object(1)], pods, NOW))
    assert rigid.status["phase"] == "Restarting" and rigid.status["attempt"] == 2  # as before: a new gang


def test_below_min_nodes_after_a_loss_waits_then_fails_as_before() -> None:
    spec = {"elastic": {"minNodes": 2, "maxNodes": 3}, "nodes": 3}
    pods = [pod_object(1, 0), _evicted_from_lost_node(pod_object(1, 1)), pod_object(1, 2, ready=False)]
    plan = decision.decide(
        observed(
            ddpjob_body({"phase": "Running", "attempt": 1, "elastic": {"nodes": 3}}, **spec),
            [job_object(1)],
            pods,
            NOW,
        )
    )
    ready = {c["type"]: c for c in plan.status["conditions"]}["Ready"]
    assert ready["reason"] == "BelowMinNodes" and plan.delete_jobs == (), ready


def test_an_elastic_jobs_taken_pods_are_replaced_and_a_rigid_jobs_fail_it() -> None:
    def rules(**spec: Any) -> list[dict[str, Any]]:
        rendered: list[dict[str, Any]] = render.render_job(spec_of(**spec), 1)["spec"]["podFailurePolicy"][
            "rules"
        ]
        return rendered

    rigid, elastic = rules(), rules(**ELASTIC)
    assert [r["action"] for r in rigid] == ["FailJob"]  # a configuration exit code; any other fails the Job
    assert [r["action"] for r in elastic] == ["FailJob", "Ignore", "Ignore"]
    assert elastic[1]["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
    assert elastic[2]["onExitCodes"]["values"] == [143]  # SIGTERM: its pod deleted, the trainer checkpointed


def _slice(name: str, replaces: str = "", **conditions: tuple[str, str, str]) -> dict[str, Any]:
    """A Workload of Job job-1 as the index keeps it (workloads.slim): conditions by type, (status, reason,
    message)."""
    body: dict[str, Any] = {
        "metadata": {
            "name": name,
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "job-1"}],
            "annotations": {workloads.SLICE_REPLACES: replaces} if replaces else {},
        },
        "status": {
            "conditions": [
                {"type": kind, "status": status, "reason": reason, "message": message}
                for kind, (status, reason, message) in conditions.items()
            ]
        },
    }
    return workloads.slim(body)


def test_a_scale_up_waiting_for_kueue_trains_on_and_says_why_in_kueues_words() -> None:
    """Kueue's ElasticJobsViaWorkloadSlices: the scale-up is a new slice without quota; the old slice stays
    admitted until it is replaced. The DDPJob speaks of the new slice, and stays Running, BelowDesired."""
    quota = (
        "couldn't assign flavors to pod set main: "
        "insufficient unused quota for cpu in flavor f, 500m more needed"
    )
    old = _slice(
        "job-ddpjob-1-a", Admitted=("True", "Admitted", ""), QuotaReserved=("True", "QuotaReserved", "")
    )
    new = _slice("job-ddpjob-1-b", "ns/job-ddpjob-1-a", QuotaReserved=("False", "Pending", quota))
    assert workloads.current([old, new]) is new and workloads.current([new, old]) is new
    finished = _slice("job-ddpjob-1-b", "ns/job-ddpjob-1-a", Finished=("True", "WorkloadSliceReplaced", ""))
    assert workloads.current([finished, old]) is old, "a replaced slice is not the one spoken of"
    assert workloads.current([]) is None

    body = ddpjob_body({"phase": "Running", "attempt": 1}, nodes=3, queueName="team", **ELASTIC_3)
    pods = [pod_object(1, 0), pod_object(1, 1), pod_object(1, 2, ready=False)]
    plan = decision.decide(
        observed(body, [job_object(1)], pods, NOW, workloads={"job-1": workloads.current([old, new])})
    )
    assert plan.status["phase"] == "Running" and plan.create_job is None and plan.delete_jobs == ()
    said = {c["type"]: c for c in plan.status["conditions"]}["Ready"]["message"]
    assert said.startswith("2/3 pods ready; the new pods wait behind Kueue's scheduling gate"), said
    assert "Workload slice job-ddpjob-1-b" in said and "LocalQueue team" in said and quota in said, said
    assert plan.status["kueue"] == {"workload": "job-ddpjob-1-b", "admitted": False, "evictions": 0}
    admitted = decision.decide(observed(body, [job_object(1)], pods, NOW, workloads={"job-1": old}))
    ready = {c["type"]: c for c in admitted.status["conditions"]}["Ready"]
    assert ready["message"] == "2/3 pods ready", "once admitted, the new pods only join"
