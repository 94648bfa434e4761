"""An elastic job's rendezvous store: a Job of its own, so that no worker is a point of failure.

torchrun's ``c10d`` rendezvous keeps its state in a TCPStore one process hosts. On node rank 0 (a rigid
job's, and PyTorchJob's elastic mode's), losing that pod loses the rendezvous, and every node restarts.
An elastic DDPJob's attempt gets one Job more, ``<name>-<attempt>-rdzv``, whose one pod runs
``python -m ddp_trainer.launch.store PORT`` and nothing else: every worker's agent connects to it
(:func:`ddp_operator.children.render.rendezvous_endpoint`), so any worker may leave, node 0 included.

Its life is the attempt's: the operator creates it just before the attempt's Job and deletes it with that
Job (a gang restart) and when the DDPJob finishes; it is owned by the DDPJob, so the DDPJob's deletion takes
it too. It serves until then, so that a pod that starts late, after the others ended the job, still finds
the rendezvous, closed, and ends at once (exit 0) instead of waiting for a store that is gone. The
operator's indexes leave it out (:data:`ddp_operator.api.names.STORE_LABEL`): it is not a worker.

Where it runs: it takes nothing of ``spec.podTemplate``'s placement (the node selector, tolerations and
affinity that put the workers on GPU nodes), asks for a tenth of a CPU, and prefers a node without a worker
of the job, so it lands on stable capacity when there is any, not on the spot nodes elasticity is for. It
keeps what any pod of the namespace must carry: the security contexts (``restricted``-compliant), the
service account, image pull secrets and priority class.
"""

from __future__ import annotations

from typing import Any

from ddp_operator.api.names import ATTEMPT_LABEL, JOB_NAME_LABEL, STORE_LABEL, STORE_SUFFIX
from ddp_operator.api.spec import Spec
from ddp_operator.children import render
from ddp_operator.children.container import secure_container

Obj = dict[str, Any]

STORE_REQUESTS = {"cpu": "100m", "memory": "256Mi"}
"""torch imported and one TCPStore serving a few keys: about 200 MiB resident, no CPU to speak of."""
STORE_COMMAND = ("python", "-m", "ddp_trainer.launch.store")


STORE_BACKOFF_LIMIT = 3
"""A store pod that fails (its node lost) is replaced this many times, in the same attempt. The new pod's
store starts empty; the running pods' launchers reconnect to it and the first writes its last view of the
round back (``ddp_trainer.launch.rounds.RoundWatch.restore``), so the world re-forms with the new store at
its next resize: no pod restarts, no gang restart (docs/operator.md, "The rendezvous store lost"). Until the
new pod answers the world cannot change."""


def render_store(spec: Spec, attempt: int) -> Obj:
    """The store Job of one attempt of an elastic job. Its pod's ``hostname`` and ``subdomain`` give it
    the DNS name the workers' ``PET_RDZV_ENDPOINT`` names, through the job's headless Service (it carries
    the job's label)."""
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
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [{"name": "rendezvous", "containerPort": spec.master_port, "protocol": "TCP"}],
        "resources": {"requests": dict(STORE_REQUESTS)},
        "securityContext": {**secure_container(), **template.container_security_context},
    }
    pod: Obj = {
        "hostname": render.store_hostname(spec, attempt),
        "subdomain": render.service_name(spec),
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 5,
        "securityContext": render.secure_pod(spec),
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
    metadata = {
        "name": name,
        "namespace": spec.namespace,
        "labels": labels,
        "ownerReferences": [render.owner_reference(spec)],
    }
    job_spec = {
        "completions": 1,
        "parallelism": 1,
        "backoffLimit": STORE_BACKOFF_LIMIT,
        "template": {"metadata": {"labels": labels}, "spec": pod},
    }
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": job_spec}


def store_of(job_name: str) -> str:
    """The store Job of the attempt whose Job is ``job_name``."""
    return f"{job_name}{STORE_SUFFIX}"
