"""The names every part of the operator shares: the labels and annotations on the children, the trainer
container's name and the pod's volume names. ``render`` writes them, ``observe`` and ``handlers`` select
and read by them, ``podcheck`` reserves the volume names, local mode lays out its folders by them.

Names that cross the pod boundary (environment variables, the metrics port's name, metric labels) are the
trainer's too and live in :mod:`ddp_trainer.contract`.
"""

from __future__ import annotations

from typing import Final

MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "ddpjob-operator"
"""The value of :data:`MANAGED_BY_LABEL` on every child: the operator watches Jobs and pods by it."""
JOB_NAME_LABEL: Final = "ddpjob.io/job-name"
"""The owning DDPJob's name, on every child (the Service selects the pods by it)."""
ATTEMPT_LABEL: Final = "ddpjob.io/attempt"
"""The attempt a Job and its pods belong to."""
STORE_LABEL: Final = "ddpjob.io/rendezvous-store"
"""``"true"`` on an elastic job's rendezvous store Job and its pod (:mod:`ddp_operator.children.store_job`):
not an attempt's Job nor a worker, so the operator's indexes leave them out."""
STORE_SUFFIX: Final = "-rdzv"
"""An elastic job's rendezvous store Job is ``<name>-<attempt>-rdzv``."""
KUEUE_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL: Final = "kueue.x-k8s.io/priority-class"
KUEUE_ELASTIC_ANNOTATION: Final = "kueue.x-k8s.io/elastic-job"
"""On an elastic DDPJob's Job with ``queueName``: Kueue admits a scale-up as a new Workload slice
(``ElasticJobsViaWorkloadSlices``) and frees quota at once on a scale-down."""
"""spec.workloadPriorityClassName, on the Job: the WorkloadPriorityClass Kueue gives its Workload."""
COMPLETION_INDEX_ANNOTATION: Final = "batch.kubernetes.io/job-completion-index"
"""Set by the Job controller on an Indexed Job's pods: the node rank."""
CONTAINER_NAME: Final = "trainer"
SHM_VOLUME: Final = "dshm"
"""The pod's /dev/shm volume; a name the CRD reserves."""
CHECKPOINT_VOLUME: Final = "checkpoint"
"""The pod's checkpoint volume; a name the CRD reserves."""
SYNC_HOOK_VOLUME: Final = "ddpjob-sync"
"""The emptyDir that carries the no-code-change hook (``spec.syncCheck.autoInstrument``) from the init
container to the trainer container (mounted at :data:`ddp_trainer.contract.SYNC_HOOK_DIR`); reserved."""
SYNC_HOOK_INIT_CONTAINER: Final = "ddpjob-sync"
"""The init container that fills :data:`SYNC_HOOK_VOLUME` (``python -m ddp_trainer.inject``); reserved."""
CHECKPOINT_CLAIM_SUFFIX: Final = "-checkpoints"
"""The claim the operator creates for spec.checkpoint.volumeClaimTemplate is ``<name>-checkpoints``."""
