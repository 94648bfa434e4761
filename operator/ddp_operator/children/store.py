"""An elastic job's rendezvous store: a pod of its own, so that no worker is a point of failure.

torchrun's ``c10d`` rendezvous keeps its state in a TCPStore one process hosts. On node rank 0 (a rigid
job's, and PyTorchJob's elastic mode's), losing that pod loses the rendezvous, and every node restarts.
An elastic DDPJob's attempt gets one pod more, ``<name>-<attempt>-rdzv``, that runs
``python -m ddp_trainer.launch.store PORT`` and nothing else: every worker's agent connects to it
(:func:`ddp_operator.children.render.rendezvous_endpoint`), so any worker may leave, node 0 included.

Its life is the attempt's: it is owned by the attempt's Job (not as its controller: the Job controller
neither counts nor adopts it), so a gang restart's deletion of the Job and the DDPJob's deletion take it
with them; and it exits by itself once the attempt's agents have closed the rendezvous (the job ended).

Where it runs: it takes nothing of ``spec.podTemplate``'s placement (the node selector, tolerations and
affinity that put the workers on GPU nodes), asks for a tenth of a CPU, and prefers a node without a worker
of the job, so it lands on stable capacity when there is any, not on the spot nodes elasticity is for. It
keeps what any pod of the namespace must carry: the security contexts (``restricted``-compliant), the
service account, image pull secrets and priority class.
"""

from __future__ import annotations

from typing import Any

from ddp_operator.api.names import ATTEMPT_LABEL, JOB_NAME_LABEL, STORE_LABEL
from ddp_operator.api.spec import Spec
from ddp_operator.children import render
from ddp_trainer import contract

Obj = dict[str, Any]

STORE_REQUESTS = {"cpu": "100m", "memory": "256Mi"}
"""torch imported and one TCPStore serving a few keys: about 200 MiB resident, no CPU to speak of."""
STORE_COMMAND = ("python", "-m", "ddp_trainer.launch.store")


def render_store(spec: Spec, attempt: int) -> Obj:
    """The store pod of one attempt of an elastic job, without its owner (the Job, once the API server has
    given it a uid: :func:`owned_by`). ``hostname`` and ``subdomain`` give it the DNS name the workers'
    ``PET_RDZV_ENDPOINT`` names, through the job's headless Service (it carries the job's label)."""
    template = spec.pod_template
    name = render.store_name(spec, attempt)
    worker = {"matchLabels": {JOB_NAME_LABEL: spec.name, ATTEMPT_LABEL: str(attempt)}}
    labels = {
        **render.labels(spec, attempt),
        "app.kubernetes.io/component": "rendezvous-store",
        STORE_LABEL: "true",
    }
    container = {
        "name": "rendezvous-store",
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": [*STORE_COMMAND, str(spec.master_port)],
        "env": [
            {"name": contract.PET_RDZV_ID, "value": render.rendezvous_id(spec, attempt)},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
        ],
        "ports": [{"name": "rendezvous", "containerPort": spec.master_port, "protocol": "TCP"}],
        "resources": {"requests": dict(STORE_REQUESTS)},
        "securityContext": {**render.secure_container(), **template.container_security_context},
    }
    pod: Obj = {
        "hostname": render.store_hostname(spec, attempt),
        "subdomain": render.service_name(spec),
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 5,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": render.RUN_AS_USER,
            "runAsGroup": render.RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
            **template.security_context,
        },
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {"labelSelector": worker, "topologyKey": "kubernetes.io/hostname"},
                    }
                ]
            }
        },
        "containers": [container],
    }
    optional = {
        "imagePullSecrets": [dict(s) for s in template.image_pull_secrets] or None,
        "priorityClassName": template.priority_class_name,
        "serviceAccountName": template.service_account_name,
        "schedulerName": template.scheduler_name,
    }
    pod.update({key: value for key, value in optional.items() if value is not None})
    metadata = {"name": name, "namespace": spec.namespace, "labels": labels}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod}


def owned_by(store: Obj, job: Obj) -> Obj:
    """``store`` owned by the attempt's Job as the API server returned it (its uid): deleted with it."""
    meta = job["metadata"]
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"]}
    return {**store, "metadata": {**store["metadata"], "ownerReferences": [owner]}}
