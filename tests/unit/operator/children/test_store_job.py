"""An elastic job's rendezvous store is a Job of its own (issue 42, item 3): the workers' agents connect to
its pod by DNS name, it runs the store and nothing else, keeps off the workers' GPU placement, passes the
``restricted`` Pod Security level, is created with every new attempt and deleted with it and at the end."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest

from ddp_operator.api import names, pod_security_standards
from ddp_operator.children import render, store_job
from ddp_operator.decide import decision
from ddp_trainer import contract
from helpers.reconciling import NOW, ddpjob_body, job_object, observed, pod_object, spec_of

ELASTIC = {"elastic": {"minNodes": 1, "maxNodes": 3}}
GPU_PLACEMENT = {
    "nodeSelector": {"nvidia.com/gpu.present": "true"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "securityContext": {"runAsUser": 2000},
    "priorityClassName": "training",
}


def _env(job: dict[str, Any]) -> dict[str, str]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def _pod(job: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = job["spec"]["template"]["spec"]
    return pod


def test_the_workers_of_an_elastic_job_connect_to_the_store_pod_by_its_dns_name() -> None:
    spec = spec_of(**ELASTIC)
    job, rdzv = render.render_job(spec, 2), store_job.render_store(spec, 2)
    env, pod = _env(job), _pod(rdzv)
    host = f"{pod['hostname']}.{pod['subdomain']}"
    assert env[contract.PET_RDZV_ENDPOINT] == f"{host}:{spec.master_port}" == "job-2-r.job:29500"
    assert env[contract.RDZV_STORE_ENV] == contract.RDZV_STORE_EXTERNAL  # the launcher says is_host=0
    # the headless Service selects its pod (its DNS name); the operator's indexes leave it out
    service = render.render_service(spec)
    assert service["spec"]["selector"].items() <= rdzv["spec"]["template"]["metadata"]["labels"].items()
    assert rdzv["metadata"]["labels"][names.STORE_LABEL] == "true"
    assert rdzv["spec"]["template"]["metadata"]["labels"][names.STORE_LABEL] == "true"
    assert rdzv["metadata"]["name"] == store_job.store_of(job["metadata"]["name"]) == "job-2-rdzv"
    assert rdzv["metadata"]["ownerReferences"] == job["metadata"]["ownerReferences"]  # the DDPJob's
    assert pod["containers"][0]["command"] == ["python", "-m", "ddp_trainer.launch.store", "29500"]


def test_a_rigid_job_keeps_its_store_on_node_rank_0() -> None:
    env = _env(render.render_job(spec_of(), 1))
    assert env[contract.PET_RDZV_ENDPOINT] == "$(PET_MASTER_ADDR):$(PET_MASTER_PORT)"
    assert contract.RDZV_STORE_ENV not in env
    assert not render.external_store(spec_of())
    # a command of the user's (torchrun directly) has no launcher to connect to a store elsewhere
    assert not render.external_store(spec_of(**ELASTIC, command=["torchrun", "train.py"]))


def test_the_store_keeps_off_the_workers_placement_but_not_their_security() -> None:
    spec = spec_of(**ELASTIC, podTemplate=GPU_PLACEMENT)
    pod = _pod(store_job.render_store(spec, 1))
    assert "nodeSelector" not in pod and "tolerations" not in pod  # the GPU nodes' taint keeps it off them
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["labelSelector"]["matchLabels"] == {
        names.JOB_NAME_LABEL: "job",
        names.ATTEMPT_LABEL: "1",
    }
    assert pod["securityContext"]["runAsUser"] == 2000 and pod["priorityClassName"] == "training"
    assert "nvidia.com/gpu" not in pod["containers"][0]["resources"]["requests"]
    assert pod_security_standards.violations(pod, "restricted") == []


def test_a_store_pod_that_breaks_restricted_is_caught_as_the_workers_are() -> None:
    """The check above can fail: a template that opens the containers up opens the store's too."""
    spec = spec_of(**ELASTIC, podTemplate={"containerSecurityContext": {"allowPrivilegeEscalation": True}})
    assert pod_security_standards.violations(_pod(store_job.render_store(spec, 1)), "restricted")


@pytest.mark.parametrize("release", ["1.31.0", "1.37.0"])
def test_the_store_job_passes_the_official_schema_strictly(release: str) -> None:
    kubernetes_validate.validate(store_job.render_store(spec_of(**ELASTIC), 1), release, strict=True)


def test_its_hostname_fits_wherever_the_workers_do() -> None:
    spec = spec_of(**ELASTIC)
    assert len(render.store_hostname(spec, 9)) <= len(render.pod_hostname(spec, 9, 0))


def test_every_new_attempt_of_an_elastic_job_creates_its_store_with_its_job() -> None:
    plan = decision.decide(observed(ddpjob_body(**ELASTIC), [], [], NOW))
    assert plan.create_job is not None and plan.create_store is not None
    assert plan.create_store["metadata"]["name"] == f"{plan.create_job['metadata']['name']}-rdzv"
    assert decision.decide(observed(ddpjob_body(), [], [], NOW)).create_store is None


def test_the_store_goes_with_its_attempt_and_when_the_job_finishes_never_before() -> None:
    running = {"phase": "Running", "attempt": 1}
    pods = [pod_object(1, 0), pod_object(1, 1)]
    plan = decision.decide(observed(ddpjob_body(running, **ELASTIC), [job_object(1)], pods, NOW))
    assert plan.delete_jobs == ()  # training: the store serves
    failed = [pod_object(1, 0, exit_code=1), pod_object(1, 1, exit_code=1)]
    restart = decision.decide(
        observed(ddpjob_body(running, **ELASTIC), [job_object(1, condition="Failed")], failed, NOW)
    )
    assert restart.status["attempt"] == 2 and restart.delete_jobs == ("job-1", "job-1-rdzv")
    report = json.dumps({"result": "Succeeded", "reason": "AllChecksPassed", "step": 1000, "verified": True})
    done = [pod_object(1, 0, exit_code=0, message=report), pod_object(1, 1, exit_code=0)]
    finish = decision.decide(
        observed(ddpjob_body(running, **ELASTIC), [job_object(1, condition="Complete")], done, NOW)
    )
    assert finish.status["phase"] == "Succeeded" and finish.delete_jobs == ("job-1-rdzv",)
    after = decision.decide(
        observed(ddpjob_body(finish.status, **ELASTIC), [job_object(1, condition="Complete")], done, NOW)
    )
    assert after.delete_jobs == ()  # said once, at the end
    rigid = decision.decide(observed(ddpjob_body(running), [job_object(1, condition="Complete")], done, NOW))
    assert rigid.status["phase"] == "Succeeded" and rigid.delete_jobs == ()
