"""Spec → the Kubernetes objects of one attempt: a headless Service and an Indexed Job. Pure: no I/O.

The operator applies exactly these objects, ``ddpjob local`` runs exactly these objects, and
``ddpjob render`` prints exactly these objects, so there is one implementation of the wiring.
The decision asks for an attempt's objects in one call (:func:`render_attempt`: the Service, the Job and
the checkpoint claim). Here: the names of the attempt's objects and hosts, the Service, the claim, the Job
and its pod; the pod's containers are :mod:`ddp_operator.children.container`'s, asked once per Job with
the names worked out here (:func:`attempt_names`).

Long because the attempt's names and every object that carries them, down to the pod, read best in one
place: every function here is a small pure piece of one attempt's objects.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ddp_operator.api import crd
from ddp_operator.api.names import (
    ATTEMPT_LABEL,
    CHECKPOINT_CLAIM_SUFFIX,
    CONTAINER_NAME,
    JOB_NAME_LABEL,
    KUEUE_ELASTIC_ANNOTATION,
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    STORE_SUFFIX,
)
from ddp_operator.api.spec import Spec, runs_launcher, sync_hook
from ddp_operator.children import container
from ddp_trainer import contract

TERMINATION_GRACE_SECONDS = 120  # room for the trainer to checkpoint at the next step boundary on SIGTERM
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
    """An elastic job's rendezvous store Job (:mod:`ddp_operator.children.store_job`)."""
    return f"{job_name(spec, attempt)}{STORE_SUFFIX}"


def store_hostname(spec: Spec, attempt: int) -> str:
    """The store pod's hostname, ``<name>-<attempt>-r``: no longer than a worker's
    ``<name>-<attempt>-<index>``, so it fits in a DNS label whenever theirs do (the CRD's rule), and never
    one of theirs (not a number)."""
    return f"{job_name(spec, attempt)}-r"


def external_store(spec: Spec, launcher: bool | None = None) -> bool:
    """Whether the attempt's ``c10d`` rendezvous store is a pod of its own: an elastic job whose agents the
    launcher runs (:func:`runs_launcher`, ``launcher`` where the caller asked it), so that no worker hosts
    it and any node may leave, node 0 too."""
    return spec.elastic is not None and (runs_launcher(spec) if launcher is None else launcher)


def rendezvous_endpoint(spec: Spec, attempt: int, external: bool | None = None) -> str:
    """torchrun's ``--rdzv-endpoint``: the store pod's DNS name for an elastic job, else node rank 0's
    (``external``: :func:`external_store`, where the caller knows)."""
    if external_store(spec) if external is None else external:
        return f"{store_hostname(spec, attempt)}.{service_name(spec)}:{spec.master_port}"
    return f"$({contract.PET_MASTER_ADDR}):$({contract.PET_MASTER_PORT})"


def rendezvous_id(spec: Spec, attempt: int) -> str:
    """torchrun's ``--rdzv-id``: one rendezvous per attempt."""
    return f"{spec.uid or spec.name}-{attempt}"


def master_addr(spec: Spec, attempt: int) -> str:
    """Node rank 0's DNS name, `<name>-<attempt>-0.<service>`, published before it is Ready."""
    return f"{pod_hostname(spec, attempt, 0)}.{service_name(spec)}"


def owner_reference(spec: Spec) -> Obj:
    return {
        "apiVersion": crd.API_VERSION,
        "kind": crd.KIND,
        "name": spec.name,
        "uid": spec.uid or container.PLACEHOLDER_UID,
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


def attempt_names(spec: Spec, attempt: int) -> container.AttemptNames:
    """What the trainer container needs of the attempt's names, worked out once per Job, with whether the
    container runs the launcher (asked once: the agent's environment and the store go by it)."""
    launcher = runs_launcher(spec)
    external = external_store(spec, launcher)
    return container.AttemptNames(
        attempt=attempt,
        master_addr=master_addr(spec, attempt),
        local_addr=f"{job_name(spec, attempt)}-$({contract.PET_NODE_RANK}).{service_name(spec)}",
        launcher=launcher,
        external_store=external,
        rendezvous_endpoint=rendezvous_endpoint(spec, attempt, external),
        rendezvous_id=rendezvous_id(spec, attempt),
        checkpoint_claim=checkpoint_claim_name(spec),
    )


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
    trainer, volumes = container.trainer_container(spec, attempt_names(spec, attempt), budget, hook)
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
        "containers": [trainer],
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
            *([container.sync_hook_init_container(spec)] if hook else []),
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
