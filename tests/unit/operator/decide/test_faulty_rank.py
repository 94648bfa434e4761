"""A faulty rank found by the compute probe: the policy restarts the gang, the status remembers the node,
the next attempt's pods avoid it (pure: policy, status, render, reconcile)."""

from __future__ import annotations

import json
from typing import Any

from ddp_operator.children import container, render
from ddp_operator.decide import restarts
from ddp_trainer import contract
from helpers.reconciling import job_object, pod_object, reconcile_once, spec_of

FAULTY = {
    "result": "Failed",
    "reason": contract.FAULTY_RANK,
    "message": "compute probe at step 2000: faulty rank 3 (pod job-1-1, node gpu-7): computed gradients ...",
    "verified": True,
    "checks": 21,
    "mismatches": 0,
    "repairs": 0,
    "lastCheckStep": 2000,
    "faultyRanks": [3],
    "faultyNodes": ["gpu-7"],
    "faultyPods": ["job-1-1"],
}


def _failed(attempt: int, previous: dict[str, Any], report: dict[str, Any] = FAULTY, **spec: Any) -> Any:
    pods = [
        pod_object(attempt, 0, exit_code=1, message=json.dumps(report)),
        pod_object(attempt, 1, exit_code=1),
    ]
    return reconcile_once(previous, [job_object(attempt, condition="Failed")], pods, **spec)


def test_a_faulty_rank_restarts_the_gang_away_from_its_node() -> None:
    plan = _failed(1, {"phase": "Running", "attempt": 1})
    assert (plan.status["phase"], plan.status["attempt"]) == ("Restarting", 2)
    assert plan.status["probe"]["faultyNodes"] == ["gpu-7"]
    assert plan.status["probe"]["faultyRanks"] == [3]
    event = next(e for e in plan.events if e.reason == contract.FAULTY_RANK)
    assert event.type == "Warning" and "rank 3" in event.message
    assert "away from node(s) gpu-7" in event.message
    # the next reconcile creates attempt 2, whose pods may not land on gpu-7
    plan = reconcile_once({**plan.status, "phase": "Restarting"}, [])
    assert plan.create_job is not None and plan.create_job["metadata"]["name"] == "job-2"
    terms = plan.create_job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["gpu-7"]}]}]


def test_faulty_nodes_add_up_over_attempts_and_restarts_run_out() -> None:
    previous = {"phase": "Running", "attempt": 2, "probe": {"faultyNodes": ["gpu-7"]}}
    report = {**FAULTY, "faultyNodes": ["gpu-9"]}
    plan = _failed(2, previous, report)
    assert plan.status["probe"]["faultyNodes"] == ["gpu-7", "gpu-9"]
    plan = _failed(3, {"phase": "Running", "attempt": 3}, report)
    assert plan.status["phase"] == "Failed"
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == contract.FAULTY_RANK and "2 restart(s) are used up" in failed["message"]


def test_exit_code_87_without_a_report_restarts_and_avoids_nothing() -> None:
    decision = restarts.decide(restarts.Outcome(False, exit_codes={0: contract.FAULTY_RANK_EXIT_CODE}), 1, 3)
    assert (decision.action, decision.reason) == (restarts.Action.RESTART, contract.FAULTY_RANK)
    assert "its node is not known" in decision.message


def test_the_avoidance_joins_every_term_of_the_users_affinity() -> None:
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    users = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term, {}]}},
        "podAntiAffinity": {"x": 1},
    }
    out = render.avoiding(users, ["n2", "n1", "n2"])
    assert out is not None and out["podAntiAffinity"] == {"x": 1}
    terms = out["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    avoid = {"key": "metadata.name", "operator": "NotIn", "values": ["n1", "n2"]}
    assert (
        all(t["matchFields"] == [avoid] for t in terms)
        and terms[0]["matchExpressions"] == term["matchExpressions"]
    )
    required = users["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"][1] == {}  # the user's object is not changed
    assert render.avoiding(None, []) is None and render.avoiding(users, []) == users


def test_the_pods_learn_their_node_and_the_probe_settings() -> None:
    spec = spec_of(syncCheck={"probeEverySteps": 0})
    env = {e["name"]: e for e in container.injected_env(spec, render.attempt_names(spec, 1))}
    assert env[contract.NODE_NAME_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env[contract.PROBE_EVERY_ENV]["value"] == "0"
    assert env[contract.ON_FAULTY_RANK_ENV]["value"] == "Fail"
