"""`ddpjob render`: golden files, the official Kubernetes schemas (strict), and the environment contract."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from ddp_operator import cli
from ddp_operator.api import names
from ddp_operator.api.spec import Spec, parse, parse_file
from ddp_operator.children import container, objects, render
from ddp_trainer import contract
from helpers import REPO

GOLDEN = Path(__file__).parent / "golden"

INPUTS = sorted(p for p in GOLDEN.glob("*.yaml") if not p.name.endswith(".rendered.yaml"))
# Three supported releases, oldest to newest that kubernetes-validate ships schemas for.
KUBERNETES_RELEASES = ["1.31.0", "1.34.0", "1.37.0"]


def _spec(path: Path) -> Spec:
    (spec,) = parse_file(path)
    return spec


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _container(job: dict[str, Any]) -> dict[str, Any]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize("source", INPUTS, ids=lambda p: p.stem)
def test_golden(source: Path) -> None:
    rendered = yaml.safe_dump_all(objects.render(_spec(source)), sort_keys=False)
    golden = source.with_suffix(".rendered.yaml")
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(rendered)
    assert golden.exists(), f"{golden.name} missing: run UPDATE_GOLDEN=1 pytest {__file__}"
    assert rendered == golden.read_text(), f"render of {source.name} changed; review, then UPDATE_GOLDEN=1"


@pytest.mark.parametrize("release", KUBERNETES_RELEASES)
@pytest.mark.parametrize("source", INPUTS + sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.stem)
def test_objects_pass_the_official_schemas_strictly(source: Path, release: str) -> None:
    for attempt in (1, 3):
        for obj in objects.render(_spec(source), attempt=attempt):
            kubernetes_validate.validate(obj, release, strict=True)


def test_strict_validation_can_fail() -> None:
    """The check above would catch a typo in a rendered field."""
    job = render.render_job(_spec(GOLDEN / "cpu.yaml"), 1)
    job["spec"]["template"]["spec"]["subDomain"] = "oops"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES_RELEASES[-1], strict=True)


def test_environment_contract() -> None:
    spec = _spec(GOLDEN / "gpu-nccl.yaml")
    job = render.render_job(spec, 2)
    env = _env(_container(job))
    index = {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    assert env["PET_NNODES"] == env["NNODES"] == "3"
    assert env["PET_NPROC_PER_NODE"] == "4"
    assert env["PET_NODE_RANK"] == env["NODE_RANK"] == index
    assert env["PET_MASTER_ADDR"] == env["MASTER_ADDR"] == "gpu-job-2-0.gpu-job"
    assert env["PET_MASTER_PORT"] == env["MASTER_PORT"] == "29500"
    assert env["WORLD_SIZE"] == "12"  # processes, not pods
    assert env["DDPJOB_NAME"] == "gpu-job"
    assert env["DDPJOB_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["DDPJOB_ATTEMPT"] == "2"
    assert env["DDPJOB_METRICS_PORT"] == "9400"
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["NCCL_IB_DISABLE"] == "1"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"  # as the trainer and docs/trainer.md say
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "1000"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["NCCL_NSOCKS_PERTHREAD"] == "4"
    assert "--timeout-seconds=600" in _container(job)["args"]


def test_cpu_jobs_get_no_nccl_settings_and_no_gpus() -> None:
    job = render.render_job(_spec(GOLDEN / "cpu.yaml"), 1)
    container = _container(job)
    assert not [name for name in _env(container) if "NCCL" in name]
    assert "nvidia.com/gpu" not in container.get("resources", {}).get("limits", {})
    assert "--backend=gloo" in container["args"]


def test_user_env_wins_and_comes_last() -> None:
    container = _container(render.render_job(_spec(GOLDEN / "env-override.yaml"), 1))
    names = [e["name"] for e in container["env"]]
    assert names.count("MASTER_PORT") == names.count("PET_MASTER_PORT") == 1
    assert names[-3:] == ["MASTER_PORT", "PET_MASTER_PORT", "WANDB_API_KEY"]
    env = _env(container)
    assert env["MASTER_PORT"] == "23456"
    assert env["PET_MASTER_PORT"] == "$(MASTER_PORT)"
    assert container["command"] == ["torchrun"]
    assert container["args"][0] == "/app/train.py"


def test_gpu_limit_defaults_to_procs_per_node() -> None:
    doc = yaml.safe_load((GOLDEN / "gpu-nccl.yaml").read_text())
    del doc["spec"]["resources"]
    container = _container(render.render_job(parse(doc), 1))
    assert container["resources"] == {
        "limits": {"nvidia.com/gpu": "4"},
        "requests": {"cpu": "2", "memory": "4Gi"},  # the default requests: 500m and 1Gi per process
    }


def test_pods_find_each_other_through_the_headless_service() -> None:
    spec = _spec(GOLDEN / "cpu.yaml")
    service, job = objects.render(spec)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    pod = job["spec"]["template"]
    assert pod["spec"]["subdomain"] == service["metadata"]["name"]
    assert all(pod["metadata"]["labels"][k] == v for k, v in service["spec"]["selector"].items())
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    assert job["spec"]["backoffLimit"] == 0


def test_every_child_is_labelled_and_owned() -> None:
    spec = replace(_spec(GOLDEN / "cpu.yaml"), uid="1234")
    for obj in objects.render(spec, attempt=4):
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "ddpjob-operator"
        assert labels["ddpjob.io/job-name"] == "cpu-job"
        (owner,) = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "DDPJob",
            "cpu-job",
            "1234",
            True,
        )
    job = render.render_job(spec, 4)
    assert job["metadata"]["labels"]["ddpjob.io/attempt"] == "4"
    assert job["spec"]["template"]["metadata"]["labels"]["ddpjob.io/attempt"] == "4"


def test_pods_are_locked_down() -> None:
    job = render.render_job(_spec(GOLDEN / "cpu.yaml"), 1)
    pod = job["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    container = pod["containers"][0]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}} in pod["volumes"]


def test_kueue_and_suspend() -> None:
    queued = render.render_job(_spec(GOLDEN / "gpu-nccl.yaml"), 1)
    assert queued["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert queued["spec"]["suspend"] is True
    suspended = render.render_job(_spec(GOLDEN / "pod-template.yaml"), 1)
    assert "kueue.x-k8s.io/queue-name" not in suspended["metadata"]["labels"]
    assert suspended["spec"]["suspend"] is True
    assert render.render_job(_spec(GOLDEN / "cpu.yaml"), 1)["spec"]["suspend"] is False


def test_longest_hostname_fits_a_dns_label() -> None:
    doc = yaml.safe_load((GOLDEN / "cpu.yaml").read_text())
    doc["spec"].update(nodes=100, maxRestarts=100)
    doc["metadata"]["name"] = "n" * (63 - len("-101-99"))
    spec = parse(doc)
    assert len(render.pod_hostname(spec, spec.max_restarts + 1, spec.nodes - 1)) == 63


def test_render_is_pure() -> None:
    spec = _spec(GOLDEN / "pod-template.yaml")
    first = objects.render(spec)
    first[1]["spec"]["template"]["spec"]["volumes"].append({"name": "mutated"})
    assert objects.render(spec) != first
    assert objects.render(spec) == objects.render(spec)


def test_attempt_must_be_positive() -> None:
    with pytest.raises(ValueError, match="attempt 0: attempts are numbered from 1"):
        objects.render(_spec(GOLDEN / "cpu.yaml"), attempt=0)


def test_cli_render(capsys: pytest.CaptureFixture[str], write_yaml: Callable[..., Path]) -> None:
    assert cli.main(["render", str(GOLDEN / "cpu.yaml"), "--attempt", "2", "--namespace", "other"]) == 0
    service, job = yaml.safe_load_all(capsys.readouterr().out)
    assert (service["kind"], job["kind"]) == ("Service", "Job")
    assert job["metadata"] == {**job["metadata"], "name": "cpu-job-2", "namespace": "other"}
    bad = write_yaml(
        {
            "apiVersion": "ddpjob.io/v1alpha1",
            "kind": "DDPJob",
            "metadata": {"name": "x"},
            "spec": {"nodes": 0},
        }
    )
    assert cli.main(["render", str(bad)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "spec.nodes: Invalid value: 0" in captured.err


def _with_checkpoint(**checkpoint: Any) -> Spec:
    doc = yaml.safe_load((GOLDEN / "cpu.yaml").read_text())
    doc["spec"]["checkpoint"] = checkpoint
    doc["metadata"]["uid"] = "1234"
    return parse(doc)


def test_a_claim_template_becomes_an_owned_claim_mounted_by_every_pod() -> None:
    spec = _with_checkpoint(volumeClaimTemplate={"size": "5Gi", "storageClassName": "nfs"})
    claim, _service, job = objects.render(spec)
    assert (
        claim["kind"] == "PersistentVolumeClaim" and claim["metadata"]["name"] == f"{spec.name}-checkpoints"
    )
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],  # what every default StorageClass gives
        "resources": {"requests": {"storage": "5Gi"}},
        "storageClassName": "nfs",
    }
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "1234"
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert volumes[names.CHECKPOINT_VOLUME]["persistentVolumeClaim"] == {
        "claimName": claim["metadata"]["name"]
    }
    kubernetes_validate.validate(claim, KUBERNETES_RELEASES[-1], strict=True)
    assert _env(_container(job))["DDPJOB_UID"] == "1234"


def test_object_storage_is_a_url_flag_an_endpoint_and_the_secret_mounted_not_in_the_environment() -> None:
    secret = {"name": "minio-creds", "accessKeyIdKey": "accesskey"}
    bucket = {
        "endpoint": "http://minio.storage:9000",
        "bucket": "ckpt",
        "prefix": "team-a/",
        "region": "eu-1",
    }
    spec = _with_checkpoint(s3={**bucket, "credentialsSecret": secret})
    assert [o["kind"] for o in objects.render(spec)] == ["Service", "Job"]  # no claim
    job = render.render_job(spec, 1)
    container = _container(job)
    assert "--checkpoint-dir=s3://ckpt/team-a" in container["args"], container["args"]
    env = _env(container)
    assert (
        env[contract.S3_ENDPOINT_ENV] == "http://minio.storage:9000" and env[contract.S3_REGION_ENV] == "eu-1"
    )
    assert env[contract.S3_CREDENTIALS_ENV] == contract.S3_CREDENTIALS_DIR
    assert not any(
        "AWS_" in name or ("valueFrom" in str(value) and "secret" in str(value))
        for name, value in env.items()
    )
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert volumes[names.CHECKPOINT_VOLUME]["secret"] == {
        "secretName": "minio-creds",
        "items": [
            {"key": "accesskey", "path": contract.S3_ACCESS_KEY_FILE},
            {"key": "AWS_SECRET_ACCESS_KEY", "path": contract.S3_SECRET_KEY_FILE},
        ],
    }
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts[names.CHECKPOINT_VOLUME] == {
        "name": names.CHECKPOINT_VOLUME,
        "mountPath": contract.S3_CREDENTIALS_DIR,
        "readOnly": True,
    }
    kubernetes_validate.validate(job, KUBERNETES_RELEASES[-1], strict=True)
    # without a Secret (a pod identity, IRSA): no credentials folder is named, the bucket is
    bare = _container(render.render_job(_with_checkpoint(s3={"bucket": "ckpt"}), 1))
    assert "--checkpoint-dir=s3://ckpt/" in bare["args"] and contract.S3_CREDENTIALS_ENV not in _env(bare)


def test_a_retained_claim_has_no_owner_and_a_volume_needs_no_claim() -> None:
    retained = render.render_checkpoint_claim(
        _with_checkpoint(volumeClaimTemplate={"size": "1Gi", "reclaimPolicy": "Retain"})
    )
    assert retained is not None and "ownerReferences" not in retained["metadata"]
    assert (
        render.render_checkpoint_claim(_with_checkpoint(volume={"nfs": {"server": "s", "path": "/p"}}))
        is None
    )
    assert len(objects.render(_with_checkpoint(volume={"nfs": {"server": "s", "path": "/p"}}))) == 2


def test_configuration_exit_codes_fail_the_job_at_once() -> None:
    """The Job's podFailurePolicy carries contract.CONFIGURATION_EXIT_CODES for the trainer container."""
    job = render.render_job(_spec(INPUTS[0]), 1)
    (rule,) = job["spec"]["podFailurePolicy"]["rules"]
    assert rule == {
        "action": "FailJob",
        "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [2, 78]},
    }
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"  # what podFailurePolicy requires


def test_default_requests_fill_only_what_the_user_left_out() -> None:
    """A pod is never BestEffort by default; what the user requests or limits is left as written."""
    doc = yaml.safe_load((GOLDEN / "cpu.yaml").read_text())
    doc["spec"]["procsPerNode"] = 1
    doc["spec"]["resources"] = {}
    assert _container(render.render_job(parse(doc), 1))["resources"] == {
        "requests": {"cpu": "500m", "memory": "1Gi"}
    }
    doc["spec"]["resources"] = {"limits": {"memory": "8Gi"}, "requests": {"cpu": "3"}}
    assert _container(render.render_job(parse(doc), 1))["resources"] == {
        "limits": {"memory": "8Gi"},
        "requests": {"cpu": "3"},
    }


def test_a_single_process_pod_gets_rank_and_local_rank_for_a_plain_script() -> None:
    doc = yaml.safe_load((GOLDEN / "cpu.yaml").read_text())
    doc["spec"]["procsPerNode"] = 1
    env = {e["name"]: e for e in _container(render.render_job(parse(doc), 1))["env"]}
    assert env["RANK"]["valueFrom"] == env["NODE_RANK"]["valueFrom"]
    assert env["LOCAL_RANK"]["value"] == "0" and env["WORLD_SIZE"]["value"] == str(doc["spec"]["nodes"])
    doc["spec"]["procsPerNode"] = 2  # torchrun sets them per process
    env = {e["name"]: e for e in _container(render.render_job(parse(doc), 1))["env"]}
    assert "RANK" not in env and "LOCAL_RANK" not in env


def test_pod_settings_pass_through_and_merge_over_the_defaults() -> None:
    doc = yaml.safe_load((GOLDEN / "cpu.yaml").read_text())
    sidecar = {"name": "logs", "image": "busybox", "restartPolicy": "Always"}
    doc["spec"]["envFrom"] = [{"configMapRef": {"name": "settings"}}]
    doc["spec"]["podTemplate"] = {
        "imagePullSecrets": [{"name": "registry"}],
        "runtimeClassName": "nvidia",
        "securityContext": {"fsGroup": 2000},
        "containerSecurityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
        "hostNetwork": True,
        "initContainers": [sidecar],
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
        ],
    }
    pod = render.render_job(parse(doc), 1)["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "registry"}] and pod["runtimeClassName"] == "nvidia"
    assert pod["securityContext"]["fsGroup"] == 2000 and pod["securityContext"]["runAsUser"] == 1000
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["initContainers"] == [sidecar] and pod["topologySpreadConstraints"][0]["topologyKey"] == "zone"
    container = pod["containers"][0]
    assert container["envFrom"] == [{"configMapRef": {"name": "settings"}}]
    assert container["securityContext"]["capabilities"] == {"add": ["IPC_LOCK"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


def _custom(**spec: Any) -> Spec:
    doc = yaml.safe_load((GOLDEN / "cpu.yaml").read_text())
    doc["spec"].pop("trainer", None)
    doc["spec"].update({"command": ["torchrun"], "args": ["train.py"], **spec})
    return parse(doc)


def test_a_custom_command_gets_the_sync_hook() -> None:
    """An init container of the trainer image fills a volume the trainer container mounts read-only, first
    on its PYTHONPATH (in front of the user's)."""
    from ddp_trainer import contract

    job = render.render_job(_custom(env=[{"name": "PYTHONPATH", "value": "/app/src"}]), 1)
    pod = job["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["name"] == names.SYNC_HOOK_INIT_CONTAINER and init["image"] == container.trainer_image()
    assert init["command"] == ["python", "-m", "ddp_trainer.inject", contract.SYNC_HOOK_DIR]
    assert init["volumeMounts"] == [{"name": names.SYNC_HOOK_VOLUME, "mountPath": contract.SYNC_HOOK_DIR}]
    assert {"name": names.SYNC_HOOK_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
    mount = {"name": names.SYNC_HOOK_VOLUME, "mountPath": contract.SYNC_HOOK_DIR, "readOnly": True}
    assert mount in _container(job)["volumeMounts"]
    assert _env(_container(job))["PYTHONPATH"] == f"{contract.SYNC_HOOK_DIR}:/app/src"
    assert _env(_container(render.render_job(_custom(), 1)))["PYTHONPATH"] == contract.SYNC_HOOK_DIR


@pytest.mark.parametrize(
    "spec",
    [
        lambda: _spec(GOLDEN / "cpu.yaml"),  # the built-in trainer checks itself
        lambda: _custom(syncCheck={"autoInstrument": False}),
        lambda: _custom(
            env=[{"name": "PYTHONPATH", "valueFrom": {"configMapKeyRef": {"name": "p", "key": "k"}}}]
        ),
    ],
    ids=["built-in trainer", "switched off", "PYTHONPATH from valueFrom"],
)
def test_no_sync_hook(spec: Callable[[], Spec]) -> None:
    job = render.render_job(spec(), 1)
    pod = job["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    assert names.SYNC_HOOK_VOLUME not in {v["name"] for v in pod["volumes"]}
    assert not isinstance(_env(_container(job)).get("PYTHONPATH"), str)


def test_a_pythonpath_from_value_from_is_said_to_turn_the_hook_off() -> None:
    from ddp_operator.api.spec_warnings import warnings

    ref = {"configMapKeyRef": {"name": "p", "key": "k"}}
    said = warnings(_custom(env=[{"name": "PYTHONPATH", "valueFrom": ref}]))
    assert any(w.startswith("spec.env PYTHONPATH: it comes from valueFrom") for w in said), said
    assert not any("PYTHONPATH" in w for w in warnings(_custom())), warnings(_custom())


@pytest.mark.parametrize(
    ("command", "in_place"),
    [
        (None, True),  # the image's ENTRYPOINT: the launcher
        (list(contract.IMAGE_ENTRYPOINT), True),
        (["torchrun", "--nproc-per-node", "2", "train.py"], False),
        (["python", "train.py"], False),
    ],
)
def test_only_the_launcher_restarts_in_place(command: list[str] | None, in_place: bool) -> None:
    """torchrun's agent would restart any failure in place, a divergence (86) or a faulty rank (87) too;
    only the launcher keeps the rules, so only it gets the c10d rendezvous and a restart budget."""
    doc = yaml.safe_load((GOLDEN / "cpu.yaml").read_text())
    doc["spec"]["maxRestarts"] = 3
    if command is not None:
        doc["spec"]["command"] = command
    env = _env(_container(render.render_job(parse(doc), 1)))
    elastic = {contract.PET_RDZV_BACKEND, contract.PET_RDZV_ENDPOINT, contract.PET_MAX_RESTARTS}
    assert (elastic <= set(env)) is in_place and (not elastic & set(env)) is (not in_place), env
    if in_place:
        assert env[contract.PET_MAX_RESTARTS] == "3" and env[contract.PET_RDZV_BACKEND] == "c10d"


def test_an_elastic_job_runs_torchrun_over_its_range_with_its_global_batch_and_kueues_slices() -> None:
    doc = yaml.safe_load((REPO / "examples" / "elastic.yaml").read_text())
    doc["spec"]["queueName"] = "team"
    spec = parse(doc)
    job = render.render_job(spec, 1)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert _env(container)[contract.PET_NNODES] == "1:3"
    assert "--elastic-max-nodes=3" in container["args"]
    assert job["metadata"]["annotations"] == {names.KUEUE_ELASTIC_ANNOTATION: "true"}
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
    rigid = render.render_job(parse_file(REPO / "examples" / "quickstart.yaml")[0], 1)
    assert "annotations" not in rigid["metadata"]
    assert _env(rigid["spec"]["template"]["spec"]["containers"][0])[contract.PET_NNODES] == "2"
