"""An elastic job's rendezvous store is a pod of its own (issue 42, item 3): the workers' agents connect to
it by its DNS name, it runs the store and nothing else, keeps off the workers' GPU placement, passes the
``restricted`` Pod Security level, is owned by the attempt's Job, and is created with every new attempt."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from ddp_operator.api import names, podsecurity
from ddp_operator.children import render, store
from ddp_operator.decide import decision
from ddp_trainer import contract
from helpers.reconciling import NOW, ddpjob_body, spec_of

ELASTIC = {"elastic": {"minNodes": 1, "maxNodes": 3}}
GPU_PLACEMENT = {
    "nodeSelector": {"nvidia.com/gpu.present": "true"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "securityContext": {"runAsUser": 2000},
    "priorityClassName": "training",
}


def _env(obj: dict[str, Any]) -> dict[str, str]:
    pod = obj["spec"]["template"]["spec"] if obj["kind"] == "Job" else obj["spec"]
    (container,) = pod["containers"]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_the_workers_of_an_elastic_job_connect_to_the_store_pod_by_its_dns_name() -> None:
    spec = spec_of(**ELASTIC)
    job, pod = render.render_job(spec, 2), store.render_store(spec, 2)
    env = _env(job)
    host = f"{pod['spec']['hostname']}.{pod['spec']['subdomain']}"
    assert env[contract.PET_RDZV_ENDPOINT] == f"{host}:{spec.master_port}" == "job-2-r.job:29500"
    assert env[contract.RDZV_STORE_ENV] == contract.RDZV_STORE_EXTERNAL  # the launcher says is_host=0
    assert env[contract.PET_RDZV_ID] == _env(pod)[contract.PET_RDZV_ID]  # the store ends with this one
    # the headless Service selects it (its DNS name), the operator's pod index does not (not a worker)
    service = render.render_service(spec)
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert pod["metadata"]["labels"][names.STORE_LABEL] == "true"
    assert pod["metadata"]["name"] == "job-2-rdzv"
    assert pod["spec"]["containers"][0]["command"] == ["python", "-m", "ddp_trainer.launch.store", "29500"]


def test_a_rigid_job_keeps_its_store_on_node_rank_0() -> None:
    env = _env(render.render_job(spec_of(), 1))
    assert env[contract.PET_RDZV_ENDPOINT] == "$(PET_MASTER_ADDR):$(PET_MASTER_PORT)"
    assert contract.RDZV_STORE_ENV not in env
    assert not render.external_store(spec_of())
    # a command of the user's (torchrun directly) has no launcher to connect to a store elsewhere
    assert not render.external_store(spec_of(**ELASTIC, command=["torchrun", "train.py"]))


def test_the_store_keeps_off_the_workers_placement_but_not_their_security() -> None:
    spec = spec_of(**ELASTIC, podTemplate=GPU_PLACEMENT)
    pod = store.render_store(spec, 1)["spec"]
    assert "nodeSelector" not in pod and "tolerations" not in pod  # the GPU nodes' taint keeps it off them
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["labelSelector"]["matchLabels"] == {
        names.JOB_NAME_LABEL: "job",
        names.ATTEMPT_LABEL: "1",
    }
    assert pod["securityContext"]["runAsUser"] == 2000 and pod["priorityClassName"] == "training"
    assert "nvidia.com/gpu" not in pod["containers"][0]["resources"]["requests"]
    assert podsecurity.violations(pod, "restricted") == []


def test_a_store_pod_that_breaks_restricted_is_caught_as_the_workers_are() -> None:
    """The check above can fail: a template that opens the containers up opens the store's too."""
    spec = spec_of(**ELASTIC, podTemplate={"containerSecurityContext": {"allowPrivilegeEscalation": True}})
    assert podsecurity.violations(store.render_store(spec, 1)["spec"], "restricted")


@pytest.mark.parametrize("release", ["1.31.0", "1.37.0"])
def test_the_store_pod_passes_the_official_schema_strictly(release: str) -> None:
    job = render.render_job(spec_of(**ELASTIC), 1)
    job["metadata"]["uid"] = "6f1c2a9e-0000-4000-8000-000000000001"
    kubernetes_validate.validate(
        store.owned_by(store.render_store(spec_of(**ELASTIC), 1), job), release, strict=True
    )


def test_the_store_is_owned_by_its_job_but_not_controlled_by_it() -> None:
    job = {"metadata": {"name": "job-1", "uid": "u-1"}}
    pod = store.owned_by(store.render_store(spec_of(**ELASTIC), 1), job)
    (owner,) = pod["metadata"]["ownerReferences"]
    assert owner == {"apiVersion": "batch/v1", "kind": "Job", "name": "job-1", "uid": "u-1"}  # no controller


def test_its_hostname_fits_wherever_the_workers_do() -> None:
    spec = spec_of(**ELASTIC)
    assert len(render.store_hostname(spec, 9)) <= len(render.pod_hostname(spec, 9, 0))


def test_every_new_attempt_of_an_elastic_job_creates_its_store_with_its_job() -> None:
    plan = decision.decide_for(ddpjob_body(**ELASTIC), [], [], NOW)
    assert plan.create_job is not None and plan.create_store is not None
    assert plan.create_store["metadata"]["name"] == f"{plan.create_job['metadata']['name']}-rdzv"
    assert decision.decide_for(ddpjob_body(), [], [], NOW).create_store is None
