"""Spec → the Kubernetes objects of one attempt: a headless Service and an Indexed Job. Pure: no I/O.

The operator applies exactly these objects, ``ddpjob local`` runs exactly these objects, and
``ddpjob render`` prints exactly these objects, so there is one implementation of the wiring.
The decision asks for an attempt's objects in one call (:func:`render_attempt`: the Service, the Job and
the checkpoint claim).

Long because the whole pod (environment contract, command, volumes, security context) reads best in one
place: every function here is a small pure piece of one Job.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ddp_operator.api import crd
from ddp_operator.api.names import (
    ATTEMPT_LABEL,
    CHECKPOINT_CLAIM_SUFFIX,
    CHECKPOINT_VOLUME,
    COMPLETION_INDEX_ANNOTATION,
    CONTAINER_NAME,
    JOB_NAME_LABEL,
    KUEUE_ELASTIC_ANNOTATION,
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    SHM_VOLUME,
    STORE_SUFFIX,
    SYNC_HOOK_INIT_CONTAINER,
    SYNC_HOOK_VOLUME,
)
from ddp_operator.api.spec import Spec, runs_launcher, sync_hook
from ddp_trainer import contract

DEFAULT_CHECKPOINT_DIR = "/checkpoints"
TERMINATION_GRACE_SECONDS = 120  # room for the trainer to checkpoint at the next step boundary on SIGTERM
DEFAULT_CHECKPOINT_KEEP = 2  # spec.checkpoint.keep's default in the CRD
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"  # `ddpjob render` before the DDPJob exists
RUN_AS_USER = 1000

Obj = dict[str, Any]


def labels(spec: Spec, attempt: int | None = None) -> dict[str, str]:
    """The labels every child carries; the attempt's own objects add the attempt."""
    out = {
        "app.kubernetes.io/name": "ddpjob",
        "app.kubernetes.io/instance": spec.name,
        "app.kubernetes.io/component": "trainer",
        MANAGED_BY_LABEL: MANAGED_BY,
        JOB_NAME_LABEL: spec.name,
    }
    if attempt is not None:
        out[ATTEMPT_LABEL] = str(attempt)
    return out


def job_name(spec: Spec, attempt: int) -> str:
    return f"{spec.name}-{attempt}"


def service_name(spec: Spec) -> str:
    return spec.name


def pod_hostname(spec: Spec, attempt: int, index: int) -> str:
    """The Job controller names an Indexed Job's pod hosts <job>-<index>; with the subdomain they resolve."""
    return f"{job_name(spec, attempt)}-{index}"


def store_name(spec: Spec, attempt: int) -> str:
    """An elastic job's rendezvous store Job (:mod:`ddp_operator.children.store`)."""
    return f"{job_name(spec, attempt)}{STORE_SUFFIX}"


def store_hostname(spec: Spec, attempt: int) -> str:
    """The store pod's hostname, ``<name>-<attempt>-r``: no longer than a worker's
    ``<name>-<attempt>-<index>``, so it fits in a DNS label whenever theirs do (the CRD's rule), and never
    one of theirs (not a number)."""
    return f"{job_name(spec, attempt)}-r"


def external_store(spec: Spec) -> bool:
    """Whether the attempt's ``c10d`` rendezvous store is a pod of its own: an elastic job whose agents the
    launcher runs (:func:`runs_launcher`), so that no worker hosts it and any node may leave, node 0 too."""
    return spec.elastic is not None and runs_launcher(spec)


def rendezvous_endpoint(spec: Spec, attempt: int) -> str:
    """torchrun's ``--rdzv-endpoint``: the store pod's DNS name for an elastic job, else node rank 0's."""
    if external_store(spec):
        return f"{store_hostname(spec, attempt)}.{service_name(spec)}:{spec.master_port}"
    return f"$({contract.PET_MASTER_ADDR}):$({contract.PET_MASTER_PORT})"


def master_addr(spec: Spec, attempt: int) -> str:
    """Node rank 0's DNS name, `<name>-<attempt>-0.<service>`, published before it is Ready."""
    return f"{pod_hostname(spec, attempt, 0)}.{service_name(spec)}"


def owner_reference(spec: Spec) -> Obj:
    return {
        "apiVersion": crd.API_VERSION,
        "kind": crd.KIND,
        "name": spec.name,
        "uid": spec.uid or PLACEHOLDER_UID,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(spec: Spec, name: str, attempt: int | None) -> Obj:
    return {
        "name": name,
        "namespace": spec.namespace,
        "labels": labels(spec, attempt),
        "ownerReferences": [owner_reference(spec)],
    }


def render_service(spec: Spec) -> Obj:
    """The headless Service that gives every pod `<host>.<service>` DNS, even before it is Ready."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, service_name(spec), None),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {JOB_NAME_LABEL: spec.name},
            "ports": [
                {"name": "rendezvous", "port": spec.master_port, "targetPort": spec.master_port},
                {
                    "name": contract.METRICS_PORT_NAME,
                    "port": spec.metrics_port,
                    "targetPort": spec.metrics_port,
                },
            ],
        },
    }


def checkpoint_claim_name(spec: Spec) -> str:
    return f"{spec.name}{CHECKPOINT_CLAIM_SUFFIX}"


def render_checkpoint_claim(spec: Spec) -> Obj | None:
    """The PersistentVolumeClaim of ``spec.checkpoint.volumeClaimTemplate``, or None. Owned by the DDPJob
    (deleted with it) unless its reclaimPolicy is Retain."""
    claim = spec.checkpoint.claim if spec.checkpoint else None
    if claim is None:
        return None
    metadata = _metadata(spec, checkpoint_claim_name(spec), None)
    if claim.reclaim_policy == "Retain":
        del metadata["ownerReferences"]
    pvc_spec: Obj = {
        "accessModes": list(claim.access_modes),
        "resources": {"requests": {"storage": str(claim.size)}},
    }
    if claim.storage_class_name is not None:
        pvc_spec["storageClassName"] = claim.storage_class_name
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": pvc_spec}


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


def rendezvous_id(spec: Spec, attempt: int) -> str:
    """torchrun's ``--rdzv-id``: one rendezvous per attempt."""
    return f"{spec.uid or spec.name}-{attempt}"


def _elastic_env(spec: Spec, attempt: int, budget: int | None) -> list[Obj]:
    """torchrun's agent under the launcher (:func:`runs_launcher`; nothing otherwise): the ``c10d``
    rendezvous (so a restart on one node restarts every node), its store on node rank 0 or, for an elastic
    job, in a pod of its own (:func:`rendezvous_endpoint`), one rendezvous per attempt, this pod's own name
    as its address (rank 0's is its workers' MASTER_ADDR; the agents are ordered by it, so pod 0 holds
    rank 0), and the restart budget."""
    if not runs_launcher(spec):
        return []
    own = f"{job_name(spec, attempt)}-$({contract.PET_NODE_RANK}).{service_name(spec)}"
    external = [_value(contract.RDZV_STORE_ENV, contract.RDZV_STORE_EXTERNAL)] if external_store(spec) else []
    return [
        _value(contract.PET_RDZV_BACKEND, contract.RDZV_BACKEND),
        _value(contract.PET_RDZV_ENDPOINT, rendezvous_endpoint(spec, attempt)),
        _value(contract.PET_RDZV_ID, rendezvous_id(spec, attempt)),
        *external,
        _value(contract.PET_LOCAL_ADDR, own),
        _value(contract.PET_MAX_RESTARTS, spec.max_restarts if budget is None else budget),
    ]


def injected_env(spec: Spec, attempt: int, budget: int | None = None) -> list[Obj]:
    """The environment contract (docs/operator.md; names in ``ddp_trainer.contract``), before the user's
    env is laid over it."""
    index = f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"
    addr = master_addr(spec, attempt)
    env = [
        _value(contract.PET_NNODES, nnodes(spec)),
        _value(contract.PET_NPROC_PER_NODE, spec.procs_per_node),
        _field(contract.PET_NODE_RANK, index),
        _value(contract.PET_MASTER_ADDR, addr),
        _value(contract.PET_MASTER_PORT, spec.master_port),
        *_elastic_env(spec, attempt, budget),
        _value(contract.MASTER_ADDR, addr),
        _value(contract.MASTER_PORT, spec.master_port),
        _value(contract.NNODES, spec.nodes),
        _field(contract.NODE_RANK, index),
        _value(contract.WORLD_SIZE, spec.world_size),
        *_single_process_ranks(spec, index),
        _value(contract.JOB_NAME_ENV, spec.name),
        _value(contract.JOB_UID_ENV, spec.uid or PLACEHOLDER_UID),
        _field(contract.JOB_NAMESPACE_ENV, "metadata.namespace"),
        _value(contract.ATTEMPT_ENV, attempt),
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


def container_env(spec: Spec, attempt: int, budget: int | None = None, hook: bool | None = None) -> list[Obj]:
    """Injected variables the user did not set, then the user's (which may refer to them with $(VAR)).
    With the sync hook, its folder goes first on ``PYTHONPATH``, in front of the user's value if any
    (``hook``: whether the pods get it, :func:`~ddp_operator.api.spec.sync_hook`, where the caller knows)."""
    users = {entry["name"] for entry in spec.env}
    injected = [e for e in injected_env(spec, attempt, budget) if e["name"] not in users]
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


def _volumes(spec: Spec, hook: bool) -> tuple[list[Obj], list[Obj]]:
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
        checkpoint_source = {"persistentVolumeClaim": {"claimName": checkpoint_claim_name(spec)}}
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


def _container(spec: Spec, attempt: int, mounts: list[Obj], budget: int | None, hook: bool) -> Obj:
    return {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        **_command(spec),
        **({"workingDir": spec.working_dir} if spec.working_dir else {}),
        "env": container_env(spec, attempt, budget, hook),
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


def secure_pod(spec: Spec) -> Obj:
    """The pod's securityContext (non-root, seccomp RuntimeDefault), ``podTemplate.securityContext`` over
    it: every pod the operator renders, the workers and an elastic job's rendezvous store."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
        **spec.pod_template.security_context,
    }


def _pod_spec(spec: Spec, attempt: int, budget: int | None, avoid_nodes: Sequence[str] = ()) -> Obj:
    template = spec.pod_template
    hook = sync_hook(spec)  # asked once: the volumes, the environment and the init containers go by it
    volumes, mounts = _volumes(spec, hook)
    pod: Obj = {
        "subdomain": service_name(spec),
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": template.service_account_name is not None,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        # the pause container is PID 1 of the pod: a user's `python train.py` as PID 1 of its own namespace
        # would ignore SIGTERM (no handler: the kernel drops it for an init) and every stop of the pod —
        # a gang restart, a suspension, a deletion — would wait out the grace period
        "shareProcessNamespace": True,
        "securityContext": secure_pod(spec),
        "containers": [_container(spec, attempt, mounts, budget, hook)],
        "volumes": volumes,
    }
    optional = {
        "nodeSelector": dict(template.node_selector) or None,
        "tolerations": _tolerations(spec),
        "affinity": avoiding(template.affinity, avoid_nodes),
        "priorityClassName": template.priority_class_name,
        "schedulerName": template.scheduler_name,
        "serviceAccountName": template.service_account_name,
        **_pod_settings(spec, hook),
    }
    pod.update({key: value for key, value in optional.items() if value is not None})
    return pod


def _pod_settings(spec: Spec, hook: bool) -> dict[str, Any]:
    """The pod settings ``spec.podTemplate`` passes through (None: not given), with the sync hook's init
    container first when the pods get it (``hook``)."""
    template = spec.pod_template
    dns_policy = template.dns_policy or ("ClusterFirstWithHostNet" if template.host_network else None)
    return {
        "imagePullSecrets": [dict(s) for s in template.image_pull_secrets] or None,
        "runtimeClassName": template.runtime_class_name,
        "hostNetwork": template.host_network,
        "dnsPolicy": dns_policy,
        "initContainers": [
            *([sync_hook_init_container(spec)] if hook else []),
            *(dict(c) for c in template.init_containers),
        ]
        or None,
        "topologySpreadConstraints": [dict(c) for c in template.topology_spread_constraints] or None,
    }


NODE_LOST_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def _tolerations(spec: Spec) -> list[Obj]:
    """The pod template's tolerations, then ``spec.nodeLostTolerationSeconds`` for a node that stopped
    answering (unless the template names those taints itself): Kubernetes would wait 300 s."""
    given = [dict(t) for t in spec.pod_template.tolerations]
    named = {t.get("key") for t in given}
    seconds = spec.node_lost_toleration_seconds
    return given + [
        {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
        for key in NODE_LOST_TAINTS
        if key not in named
    ]


def avoiding(affinity: Mapping[str, Any] | None, nodes: Sequence[str]) -> Obj | None:
    """``affinity`` (the user's, or none) with a required ``NotIn`` node affinity for ``nodes`` added to
    every node selector term (terms are ORed: each must exclude them), or unchanged when ``nodes`` is empty.
    ``matchFields`` on ``metadata.name``: the node's name itself (what the pods saw as ``spec.nodeName``),
    which a ``kubernetes.io/hostname`` label need not equal."""
    out: Obj = copy.deepcopy(dict(affinity)) if affinity else {}
    if not nodes:
        return out or None
    avoid = {"key": "metadata.name", "operator": "NotIn", "values": sorted(set(nodes))}
    required = out.setdefault("nodeAffinity", {}).setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": []}
    )
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term.setdefault("matchFields", []).append(dict(avoid))
    return out


def _failure_rules(spec: Spec) -> list[Obj]:
    """The Job's ``podFailurePolicy``: a configuration exit code (2 usage, 78 refused) fails the Job, as
    nothing can fix it. An elastic job's pod that was taken away (deleted, evicted, preempted, its node
    lost: a ``DisruptionTarget`` condition, or stopped by SIGTERM) is not a failure: the Job replaces it
    while the others train on at the smaller world, and the replacement joins at a step boundary."""
    rules: list[Obj] = [
        {
            "action": "FailJob",
            "onExitCodes": {
                "containerName": CONTAINER_NAME,
                "operator": "In",
                "values": list(contract.CONFIGURATION_EXIT_CODES),
            },
        }
    ]
    if spec.elastic is not None:
        rules += [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {
                "action": "Ignore",
                "onExitCodes": {
                    "containerName": CONTAINER_NAME,
                    "operator": "In",
                    "values": [contract.INTERRUPTED_EXIT_CODE],
                },
            },
        ]
    return rules


def render_job(spec: Spec, attempt: int, budget: int | None = None, avoid_nodes: Sequence[str] = ()) -> Obj:
    """The Indexed Job of one attempt: pod i is node rank i; one failed pod fails the attempt (a failed
    process inside a pod restarts the gang in place first, ``budget`` times at most: torchrun's
    ``--max-restarts``, what :func:`ddp_operator.decide.restarts.left` says is left of ``maxRestarts``;
    default, all of it, a first attempt's). Its pods stay off ``avoid_nodes`` (where the compute probe
    found a faulty rank: ``status.probe.faultyNodes``)."""
    metadata = _metadata(spec, job_name(spec, attempt), attempt)
    if spec.queue_name:
        metadata["labels"][KUEUE_QUEUE_LABEL] = spec.queue_name
    if spec.workload_priority_class:
        metadata["labels"][KUEUE_PRIORITY_LABEL] = spec.workload_priority_class
    if spec.queue_name and spec.elastic is not None:  # a resize is a new Workload slice, not a new Job
        metadata.setdefault("annotations", {})[KUEUE_ELASTIC_ANNOTATION] = "true"
    pod_annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(spec.metrics_port),
        "prometheus.io/path": "/metrics",
        **spec.pod_template.annotations,
    }
    job_spec: Obj = {
        "completionMode": "Indexed",
        "completions": spec.nodes,
        "parallelism": spec.nodes,
        "backoffLimit": 0,
        # A configuration exit code (2 usage, 78 refused) can never succeed: say so on the Job itself.
        "podFailurePolicy": {"rules": _failure_rules(spec)},
        # Kueue admits a queued Job by unsuspending it; a suspended DDPJob keeps its Job suspended.
        "suspend": spec.suspend or spec.queue_name is not None,
        "template": {
            "metadata": {
                "labels": {**spec.pod_template.labels, **labels(spec, attempt)},
                "annotations": pod_annotations,
            },
            "spec": _pod_spec(spec, attempt, budget, avoid_nodes),
        },
    }
    if spec.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = spec.active_deadline_seconds
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": job_spec}


class Attempt(NamedTuple):
    """The objects of one attempt, rendered in one call (:func:`render_attempt`)."""

    service: Obj | None
    """The headless Service (:func:`render_service`), when asked for (the attempt has no Job yet)."""
    job: Obj
    """The attempt's Indexed Job (:func:`render_job`)."""
    claim: Obj | None
    """The checkpoint PersistentVolumeClaim (:func:`render_checkpoint_claim`), when the spec asks for one."""


def render_attempt(
    spec: Spec,
    attempt: int,
    budget: int | None = None,
    avoid_nodes: Sequence[str] = (),
    *,
    service: bool = True,
) -> Attempt:
    """The Service (when ``service``), the Job (:func:`render_job`: ``budget``, ``avoid_nodes``) and the
    checkpoint claim (or None) of ``attempt``, in one call: what the decision's plan may create."""
    return Attempt(
        render_service(spec) if service else None,
        render_job(spec, attempt, budget, avoid_nodes),
        render_checkpoint_claim(spec),
    )
