"""The containers of an attempt's pods: the trainer container (its command and the built-in trainer's flags,
the environment contract, resources, securityContext and volume mounts, with the pod's volumes it mounts)
and the sync hook's init container. Pure: no I/O.

:mod:`ddp_operator.children.render` asks for the trainer container once per Job
(:func:`trainer_container`), handing down the attempt's names it worked out (:class:`AttemptNames`): nothing
here asks ``render`` for them (it could not: ``render`` imports this module).

Long because the environment contract, the command and what the container mounts read best beside the
container they make: every function here is a small pure piece of one container.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

from ddp_operator.api import crd
from ddp_operator.api.names import (
    CHECKPOINT_VOLUME,
    COMPLETION_INDEX_ANNOTATION,
    CONTAINER_NAME,
    SHM_VOLUME,
    SYNC_HOOK_INIT_CONTAINER,
    SYNC_HOOK_VOLUME,
)
from ddp_operator.api.spec import Spec, sync_hook
from ddp_trainer import contract

DEFAULT_CHECKPOINT_DIR = "/checkpoints"
DEFAULT_CHECKPOINT_KEEP = 2  # spec.checkpoint.keep's default in the CRD
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"  # `ddpjob render` before the DDPJob exists

Obj = dict[str, Any]


class AttemptNames(NamedTuple):
    """The attempt and what the trainer container needs of its names, worked out once per Job by
    :func:`ddp_operator.children.render.attempt_names`."""

    attempt: int
    """The attempt's number (``contract.ATTEMPT_ENV``)."""
    master_addr: str
    """Node rank 0's DNS name (:func:`ddp_operator.children.render.master_addr`)."""
    local_addr: str
    """A pod's own DNS name, by its node rank: ``<name>-<attempt>-$(PET_NODE_RANK).<service>``."""
    launcher: bool
    """Whether the container runs the launcher (:func:`~ddp_operator.api.spec.runs_launcher`)."""
    external_store: bool
    """Whether the rendezvous store is a pod of its own
    (:func:`ddp_operator.children.render.external_store`)."""
    rendezvous_endpoint: str
    """torchrun's ``--rdzv-endpoint`` (:func:`ddp_operator.children.render.rendezvous_endpoint`)."""
    rendezvous_id: str
    """torchrun's ``--rdzv-id`` (:func:`ddp_operator.children.render.rendezvous_id`)."""
    checkpoint_claim: str
    """The checkpoint claim's name (:func:`ddp_operator.children.render.checkpoint_claim_name`)."""


def checkpoint_dir(spec: Spec) -> str:
    """The trainer's ``--checkpoint-dir``: the volume's mount path, or ``s3://bucket/prefix``."""
    if spec.checkpoint is not None and spec.checkpoint.s3 is not None:
        return spec.checkpoint.s3.url
    return spec.checkpoint.mount_path if spec.checkpoint else DEFAULT_CHECKPOINT_DIR


def _s3_env(spec: Spec) -> list[Obj]:
    """Where the bucket is, and the folder of the mounted credentials (never their values)."""
    s3 = spec.checkpoint.s3 if spec.checkpoint else None
    if s3 is None:
        return []
    env = []
    if s3.endpoint:
        env.append(_value(contract.S3_ENDPOINT_ENV, s3.endpoint))
    if s3.region:
        env.append(_value(contract.S3_REGION_ENV, s3.region))
    if s3.secret_name:
        env.append(_value(contract.S3_CREDENTIALS_ENV, contract.S3_CREDENTIALS_DIR))
    return env


def trainer_values(spec: Spec) -> dict[str, object]:
    """The built-in trainer's settings by ``TrainerConfig`` field, from spec.trainer, spec.syncCheck and
    spec.nccl: the one place where the API's names meet the trainer's (``syncCheck.everySteps`` →
    ``sync_every`` → ``--sync-every``)."""
    check, ckpt = spec.sync_check, spec.checkpoint
    values: dict[str, object] = {
        "device": spec.device,
        "backend": spec.backend,
        **dataclasses.asdict(spec.trainer),  # spec.trainer's fields are TrainerConfig's, by name
        "checkpoint_dir": checkpoint_dir(spec),
        "checkpoint_keep": ckpt.keep if ckpt else DEFAULT_CHECKPOINT_KEEP,
        "sync_every": check.every_steps,
        "on_divergence": check.on_divergence,
        "timeout_seconds": spec.nccl.timeout_seconds,
    }
    if ckpt and ckpt.warm_start_from:
        values["warm_start_from"] = ckpt.warm_start_from
    if spec.elastic is not None:
        values["elastic_max_nodes"] = spec.elastic.max_nodes
    return values


def nnodes(spec: Spec) -> str | int:
    """torchrun's ``--nnodes``: the gang's size, or ``min:max`` for an elastic job (its agents then
    re-rendezvous whenever a node leaves or joins)."""
    return f"{spec.elastic.min_nodes}:{spec.elastic.max_nodes}" if spec.elastic else spec.nodes


def trainer_args(spec: Spec) -> list[str]:
    """The built-in trainer's flags (`python -m ddp_trainer --help`)."""
    return contract.trainer_argv(trainer_values(spec))


def _value(name: str, value: str | int) -> Obj:
    return {"name": name, "value": str(value)}


def _field(name: str, path: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _elastic_env(spec: Spec, names: AttemptNames, budget: int | None) -> list[Obj]:
    """torchrun's agent under the launcher (``names.launcher``; nothing otherwise): the ``c10d``
    rendezvous (so a restart on one node restarts every node), its store on node rank 0 or, for an elastic
    job, in a pod of its own (``names.rendezvous_endpoint``), one rendezvous per attempt, this pod's own
    name as its address (rank 0's is its workers' MASTER_ADDR; the agents are ordered by it, so pod 0 holds
    rank 0), and the restart budget."""
    if not names.launcher:
        return []
    external = [_value(contract.RDZV_STORE_ENV, contract.RDZV_STORE_EXTERNAL)] if names.external_store else []
    return [
        _value(contract.PET_RDZV_BACKEND, contract.RDZV_BACKEND),
        _value(contract.PET_RDZV_ENDPOINT, names.rendezvous_endpoint),
        _value(contract.PET_RDZV_ID, names.rendezvous_id),
        *external,
        _value(contract.PET_LOCAL_ADDR, names.local_addr),
        _value(contract.PET_MAX_RESTARTS, spec.max_restarts if budget is None else budget),
    ]


def injected_env(spec: Spec, names: AttemptNames, budget: int | None = None) -> list[Obj]:
    """The environment contract (docs/operator.md; names in ``ddp_trainer.contract``), before the user's
    env is laid over it."""
    index = f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"
    addr = names.master_addr
    env = [
        _value(contract.PET_NNODES, nnodes(spec)),
        _value(contract.PET_NPROC_PER_NODE, spec.procs_per_node),
        _field(contract.PET_NODE_RANK, index),
        _value(contract.PET_MASTER_ADDR, addr),
        _value(contract.PET_MASTER_PORT, spec.master_port),
        *_elastic_env(spec, names, budget),
        _value(contract.MASTER_ADDR, addr),
        _value(contract.MASTER_PORT, spec.master_port),
        _value(contract.NNODES, spec.nodes),
        _field(contract.NODE_RANK, index),
        _value(contract.WORLD_SIZE, spec.world_size),
        *_single_process_ranks(spec, index),
        _value(contract.JOB_NAME_ENV, spec.name),
        _value(contract.JOB_UID_ENV, spec.uid or PLACEHOLDER_UID),
        _field(contract.JOB_NAMESPACE_ENV, "metadata.namespace"),
        _value(contract.ATTEMPT_ENV, names.attempt),
        _value(contract.METRICS_PORT_ENV, spec.metrics_port),
        # spec.syncCheck for any command (SyncHealth reads them; the built-in trainer also gets the flags)
        _value(contract.SYNC_EVERY_ENV, spec.sync_check.every_steps),
        _value(contract.ON_DIVERGENCE_ENV, spec.sync_check.on_divergence),
        _value(contract.PROBE_EVERY_ENV, spec.sync_check.probe_every_steps),
        _value(contract.ON_FAULTY_RANK_ENV, spec.sync_check.on_faulty_rank),
        _field(contract.NODE_NAME_ENV, "spec.nodeName"),  # the compute probe names a faulty rank's node
        _value("PYTHONUNBUFFERED", "1"),
        *_s3_env(spec),
    ]
    if spec.backend == "nccl":
        env += _nccl_env(spec)
    return env


def _single_process_ranks(spec: Spec, index: str) -> list[Obj]:
    """RANK and LOCAL_RANK for a plain ``python`` script, which reads them in ``init_process_group()``: with
    one process per pod they are the node rank and 0 (torchrun sets its own per process, as always)."""
    if spec.procs_per_node != 1:
        return []
    return [_field(contract.RANK, index), _value(contract.LOCAL_RANK, 0)]


DEFAULT_CPU_MILLIS_PER_PROCESS = 500
DEFAULT_MEMORY_GI_PER_PROCESS = 1


def _default_requests(spec: Spec) -> dict[str, str]:
    """CPU and memory requests for what the user neither requests nor limits (a pod without any is
    BestEffort: evicted first, and packed onto a node with no regard for it)."""
    given = {name for values in spec.resources.values() for name in values}
    defaults = {
        "cpu": f"{millis // 1000}"
        if (millis := DEFAULT_CPU_MILLIS_PER_PROCESS * spec.procs_per_node) % 1000 == 0
        else f"{millis}m",
        "memory": f"{DEFAULT_MEMORY_GI_PER_PROCESS * spec.procs_per_node}Gi",
    }
    return {name: value for name, value in defaults.items() if name not in given}


def _nccl_env(spec: Spec) -> list[Obj]:
    nccl = spec.nccl
    env = []
    if nccl.debug is not None:
        env.append(_value("NCCL_DEBUG", nccl.debug))
    if nccl.socket_ifname is not None:
        env.append(_value("NCCL_SOCKET_IFNAME", nccl.socket_ifname))
    if nccl.ib_disable is not None:
        env.append(_value("NCCL_IB_DISABLE", "1" if nccl.ib_disable else "0"))
    defaults = dict(contract.NCCL_ENV_DEFAULTS, TORCH_NCCL_TRACE_BUFFER_SIZE=str(nccl.trace_buffer_size))
    if nccl.trace_buffer_size == 0:
        del defaults["TORCH_NCCL_DUMP_ON_TIMEOUT"]
    env += [_value(name, value) for name, value in defaults.items()]
    env.append(_value(contract.CUBLAS_WORKSPACE_ENV, contract.CUBLAS_WORKSPACE))  # the probe's determinism
    env += [_value(name, value) for name, value in sorted(nccl.env.items())]
    return env


def container_env(
    spec: Spec, names: AttemptNames, budget: int | None = None, hook: bool | None = None
) -> list[Obj]:
    """Injected variables the user did not set, then the user's (which may refer to them with $(VAR)).
    With the sync hook, its folder goes first on ``PYTHONPATH``, in front of the user's value if any
    (``hook``: whether the pods get it, :func:`~ddp_operator.api.spec.sync_hook`, where the caller knows)."""
    users = {entry["name"] for entry in spec.env}
    injected = [e for e in injected_env(spec, names, budget) if e["name"] not in users]
    user = [dict(e) for e in spec.env]
    if sync_hook(spec) if hook is None else hook:
        given = next((e for e in user if e["name"] == contract.PYTHONPATH), None)
        if given is None:
            injected.append(_value(contract.PYTHONPATH, contract.SYNC_HOOK_DIR))
        elif given.get("value"):
            given["value"] = f"{contract.SYNC_HOOK_DIR}:{given['value']}"
        else:
            given["value"] = contract.SYNC_HOOK_DIR
    return injected + user


def trainer_image() -> str:
    """The ddpjob trainer image this operator ships with: the CRD's default for ``spec.image``."""
    image: str = crd.openapi_schema()["properties"]["spec"]["properties"]["image"]["default"]
    return image


def secure_container() -> Obj:
    """Every container's securityContext unless the user's replaces a key: no privilege, no capability."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True}


def sync_hook_init_container(spec: Spec) -> Obj:
    """The init container that copies the sync hook and ``ddp_trainer`` from the trainer image into the
    pod's :data:`SYNC_HOOK_VOLUME` (``python -m ddp_trainer.inject``), as the OpenTelemetry Operator
    injects Python auto-instrumentation; a second or so, a few MB."""
    return {
        "name": SYNC_HOOK_INIT_CONTAINER,
        "image": trainer_image(),
        "imagePullPolicy": "IfNotPresent",
        "command": list(contract.SYNC_HOOK_INSTALL),
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "volumeMounts": [{"name": SYNC_HOOK_VOLUME, "mountPath": contract.SYNC_HOOK_DIR}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": secure_container(),
    }


def container_resources(spec: Spec) -> Obj:
    """The user's resources as quantity strings (the API's canonical form), plus one GPU per process and
    default CPU and memory requests (``_default_requests``)."""
    resources: Obj = {
        kind: {name: str(value) for name, value in values.items()} for kind, values in spec.resources.items()
    }
    if spec.device == "cuda":
        resources.setdefault("limits", {}).setdefault("nvidia.com/gpu", str(spec.procs_per_node))
    if defaults := _default_requests(spec):
        resources["requests"] = {**defaults, **resources.get("requests", {})}
    return resources


def _command(spec: Spec) -> Obj:
    if spec.command is None and spec.args is None:
        return {
            "command": list(contract.IMAGE_ENTRYPOINT),
            "args": ["--module", contract.TRAINER_MODULE, *trainer_args(spec)],
        }
    out: Obj = {}
    if spec.command is not None:
        out["command"] = list(spec.command)
    if spec.args is not None:
        out["args"] = list(spec.args)
    return out


def _volumes(spec: Spec, claim: str, hook: bool) -> tuple[list[Obj], list[Obj]]:
    checkpoint_source: Mapping[str, Any] = {"emptyDir": {}}
    checkpoint_mount: Obj = {"name": CHECKPOINT_VOLUME, "mountPath": checkpoint_dir(spec)}
    s3 = spec.checkpoint.s3 if spec.checkpoint is not None else None
    if spec.checkpoint is not None and spec.checkpoint.volume is not None:
        checkpoint_source = spec.checkpoint.volume
    elif s3 is not None:
        # no volume for the checkpoints: the checkpoint volume holds the bucket's credentials, if any
        checkpoint_mount = {"name": CHECKPOINT_VOLUME, "mountPath": contract.S3_CREDENTIALS_DIR}
        if s3.secret_name:
            checkpoint_mount["readOnly"] = True
            items = [
                {"key": s3.access_key_id_key, "path": contract.S3_ACCESS_KEY_FILE},
                {"key": s3.secret_access_key_key, "path": contract.S3_SECRET_KEY_FILE},
            ]
            checkpoint_source = {"secret": {"secretName": s3.secret_name, "items": items}}
    elif spec.checkpoint is not None:
        checkpoint_source = {"persistentVolumeClaim": {"claimName": claim}}
    volumes = [
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": str(spec.shm_size)}},
        {"name": CHECKPOINT_VOLUME, **checkpoint_source},
        *(dict(v) for v in spec.pod_template.volumes),
    ]
    mounts = [
        {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
        checkpoint_mount,
        *(dict(m) for m in spec.pod_template.volume_mounts),
    ]
    if hook:  # read-only: the init container wrote it (compiled too), nothing else may
        volumes.append({"name": SYNC_HOOK_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}})
        mounts.append({"name": SYNC_HOOK_VOLUME, "mountPath": contract.SYNC_HOOK_DIR, "readOnly": True})
    return volumes, mounts


def trainer_container(
    spec: Spec, names: AttemptNames, budget: int | None, hook: bool
) -> tuple[Obj, list[Obj]]:
    """The trainer container of the attempt's pods, and the pod's volumes it mounts (the sync hook's folder
    with ``hook``): torchrun's ``--max-restarts`` is ``budget`` (the spec's ``maxRestarts`` when None)."""
    volumes, mounts = _volumes(spec, names.checkpoint_claim, hook)
    container = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        **_command(spec),
        **({"workingDir": spec.working_dir} if spec.working_dir else {}),
        "env": container_env(spec, names, budget, hook),
        **({"envFrom": [dict(source) for source in spec.env_from]} if spec.env_from else {}),
        "ports": [
            {"name": "rendezvous", "containerPort": spec.master_port, "protocol": "TCP"},
            {"name": contract.METRICS_PORT_NAME, "containerPort": spec.metrics_port, "protocol": "TCP"},
        ],
        **({"resources": resources} if (resources := container_resources(spec)) else {}),
        "volumeMounts": mounts,
        "terminationMessagePath": contract.TERMINATION_LOG_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {**secure_container(), **spec.pod_template.container_security_context},
    }
    return container, volumes
