"""Bad GPUs kept out (issue 45, item 4), the pure part: what marks a node's GPUs unhealthy, what the
operator writes on a faulty rank's node, the flags that configure it, and the decisions that use them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ddp_operator.decide import decision
from ddp_operator.observe import nodehealth
from ddp_trainer import contract
from helpers.reconciling import NOW, ddpjob_body, job_object, observed, pod_object, reconcile_once

RULES = nodehealth.Rules()


def _unhealthy(nodes: list[dict[str, Any]], rules: nodehealth.Rules) -> dict[str, str]:
    """What the operator's node index holds: each node ``why_unhealthy`` names, with why."""
    found = {n["metadata"]["name"]: nodehealth.why_unhealthy(n, rules) for n in nodes}
    return {name: why for name, why in found.items() if why}


def _node(name: str, taints: list[dict[str, str]] | None = None, **conditions: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"taints": taints or []},
        "status": {
            "conditions": [{"type": k, "status": v} for k, v in {"Ready": "True", **conditions}.items()]
        },
    }


def test_taints_and_conditions_that_mark_gpus_unhealthy_are_found_and_others_are_not() -> None:
    nodes = [
        _node("ok", [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}], AcceleratedHardwareReady="True"),
        _node("nvsentinel", [{"key": "nvidia.com/gpu-error", "value": "fatal", "effect": "NoSchedule"}]),
        _node("eks", AcceleratedHardwareReady="False"),
        _node("ours", [nodehealth.faulty_taint("GPU-1234")]),
        _node("not-ready", Ready="False"),  # a node problem, not a GPU's: the Job and scheduler see it
    ]
    found = _unhealthy(nodes, RULES)
    assert found == {
        "nvsentinel": "taint nvidia.com/gpu-error=fatal:NoSchedule",
        "eks": "condition AcceleratedHardwareReady=False",
        "ours": "taint ddpjob.io/faulty-gpu=GPU-1234:NoSchedule",
    }
    # the lists are the operator's to choose: none of the defaults, one condition of its own
    rules = nodehealth.parse_rules("", "GPUProblem=True")
    assert _unhealthy([*nodes, _node("npd", GPUProblem="True")], rules) == {
        "npd": "condition GPUProblem=True"
    }


@pytest.mark.parametrize("flag", ["GPUProblem", "GPUProblem=yes", "=True"])
def test_a_bad_condition_flag_names_the_flag_the_value_and_what_is_accepted(flag: str) -> None:
    with pytest.raises(ValueError) as error:
        nodehealth.parse_rules(None, flag)
    assert "--unhealthy-conditions" in str(error.value) and "TYPE=STATUS" in str(error.value)


def test_the_taint_names_the_device_as_a_label_value_and_is_added_once() -> None:
    assert nodehealth.taint_value("GPU-8f3c2a10-1b2c-4d5e-8f90-0123456789ab").startswith("GPU-8f3c")
    assert nodehealth.taint_value("cuda:3") == "cuda-3" and nodehealth.taint_value("") == "unknown"
    assert len(nodehealth.taint_value("x" * 100)) == 63
    existing = [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    added = nodehealth.with_faulty_taint(existing, "cpu")
    assert added == [*existing, {"key": "ddpjob.io/faulty-gpu", "value": "cpu", "effect": "NoSchedule"}]
    assert nodehealth.with_faulty_taint(added, "GPU-2") is None  # one taint per key and effect


FAULTY = {
    "result": "Failed",
    "reason": contract.FAULTY_RANK,
    "message": "compute probe at step 40: faulty rank 1 (pod job-1-1, node real-2): computed ...",
    "faultyRanks": [1],
    "faultyNodes": ["real-2"],
    "faultyPods": ["job-1-1"],
    "faultyDevices": ["cpu"],
}


def test_a_faulty_verdict_asks_for_its_node_to_be_marked_with_its_device() -> None:
    pods = [pod_object(1, 0, exit_code=1, message=json.dumps(FAULTY)), pod_object(1, 1, exit_code=1)]
    plan = reconcile_once({"phase": "Running", "attempt": 1}, [job_object(1, condition="Failed")], pods)
    assert plan.mark_faulty == (("real-2", "cpu", FAULTY["message"]),)
    # the last restart too: the DDPJob fails, the node is marked all the same
    last = [pod_object(3, 0, exit_code=1, message=json.dumps(FAULTY)), pod_object(3, 1, exit_code=1)]
    plan = reconcile_once(
        {"phase": "Running", "attempt": 3}, [job_object(3, condition="Failed")], last, maxRestarts=2
    )
    assert plan.status["phase"] == "Failed" and plan.mark_faulty == (("real-2", "cpu", FAULTY["message"]),)
    # a crash marks nothing
    crashed = [pod_object(1, 0, exit_code=1), pod_object(1, 1, exit_code=1)]
    plan = reconcile_once({"phase": "Running", "attempt": 1}, [job_object(1, condition="Failed")], crashed)
    assert plan.mark_faulty == ()


def test_a_new_attempt_avoids_the_nodes_marked_unhealthy_beside_its_own_faulty_ones() -> None:
    body = ddpjob_body({"phase": "Restarting", "attempt": 2, "probe": {"faultyNodes": ["gpu-7"]}})
    unhealthy = {"gpu-9": "taint nvidia.com/gpu-error=fatal:NoSchedule", "gpu-1": "condition X=False"}
    plan = decision.decide(observed(body, [], [], NOW, unhealthy=unhealthy))
    assert plan.create_job is not None
    terms = plan.create_job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {
            "matchFields": [
                {"key": "metadata.name", "operator": "NotIn", "values": ["gpu-1", "gpu-7", "gpu-9"]}
            ]
        }
    ]
    assert (
        "affinity"
        not in decision.decide(observed(ddpjob_body(), [], [], NOW)).create_job["spec"]["template"]["spec"]
    )


def test_the_taint_keeps_jobs_off_and_its_removal_is_all_it_takes_to_let_them_back() -> None:
    marked = _node("n", [nodehealth.faulty_taint("cpu")], DDPJobFaultyGPU="True")
    assert nodehealth.why_unhealthy(marked, RULES) is not None and not nodehealth.stale_condition(marked)
    let_back = _node("n", [], DDPJobFaultyGPU="True")  # `kubectl taint node n ddpjob.io/faulty-gpu-`
    assert nodehealth.why_unhealthy(let_back, RULES) is None  # our condition alone keeps nobody off
    assert nodehealth.stale_condition(let_back)  # the operator sets it False
    assert not nodehealth.stale_condition(_node("n", [], DDPJobFaultyGPU="False"))
