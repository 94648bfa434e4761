"""Every phase, condition type and reason the operator writes: what ``kubectl get ddpj`` shows in its
PHASE and REASON columns, the ``status.conditions`` and the Events. One home, so a dashboard, an alert or
a user's script can rely on a name and a test can list them all. Values only."""

from __future__ import annotations

from typing import Final

from ddp_trainer import contract

# -- phases (``status.phase``; the CRD's enum) ------------------------------------------------------------
PENDING: Final = "Pending"
RUNNING: Final = "Running"
RESTARTING: Final = "Restarting"
SUCCEEDED: Final = "Succeeded"
FAILED: Final = "Failed"
SUSPENDED: Final = "Suspended"
PHASES: Final = (PENDING, RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED)
TERMINAL: Final = (SUCCEEDED, FAILED)

# -- condition types --------------------------------------------------------------------------------------
READY: Final = "Ready"
SYNC_VERIFIED: Final = "SyncVerified"
CHECKPOINTS_DURABLE: Final = "CheckpointsDurable"
METRICS_SCRAPED: Final = "MetricsScraped"
RENDEZVOUS_STORE_READY: Final = "RendezvousStoreReady"
"""An elastic job's rendezvous store serves (its reasons: ``observe.store_health.REASONS``)."""

# -- how an attempt ends, and what follows (``decide.restarts``) ------------------------------------------
COMPLETED: Final = "Completed"
GANG_RESTART: Final = "GangRestart"
PREEMPTED: Final = "Preempted"
"""A pod deleted gracefully or evicted (the trainer checkpointed at SIGTERM): a restart not counted."""
NODE_LOST: Final = contract.RESIZE_LOST
"""A node lost: an attempt's pod whose node went away, and ``status.elastic.lastResize.reason`` when an
elastic world shrank because a node's processes ended, or it left."""
NODE_NOT_MARKED: Final = "NodeNotMarked"
"""Warning: ``--node-health`` could not taint a faulty rank's node (the message says why)."""
STALLED: Final = "Stalled"
ATTEMPT_FAILED: Final = "AttemptFailed"
MAX_RESTARTS_EXCEEDED: Final = "MaxRestartsExceeded"
SYNC_DIVERGENCE: Final = "SyncDivergence"
INVALID_SPEC: Final = "InvalidSpec"
DEADLINE_EXCEEDED: Final = "DeadlineExceeded"
CONFIGURATION_ERROR: Final = "ConfigurationError"
CHECKPOINT_REFUSED: Final = "CheckpointRefused"
USAGE_ERROR: Final = "UsageError"
TRAINER_ERROR: Final = "TrainerError"
POD_FAILURE_POLICY: Final = "PodFailurePolicy"
"""The reason of a Job's ``Failed`` condition when its ``podFailurePolicy`` failed it (a configuration exit
code: see ``build.render``)."""
RESTARTED_IN_PLACE: Final = "RestartedInPlace"
"""An Event: torchrun's agents restarted the gang inside the same pods."""
STOPPING_ATTEMPT: Final = "StoppingAttempt"
ALL_NODES_READY: Final = "AllNodesReady"
RECONCILE_FAILED: Final = "ReconcileFailed"
BELOW_DESIRED: Final = "BelowDesired"
"""An elastic job training with fewer nodes than ``spec.nodes`` (and at least ``minNodes``)."""
POD_SECURITY: Final = "PodSecurity"
"""The API server refused the attempt's pods under Pod Security admission (the namespace's enforced level):
final for this spec; the fields are named (``observe.refused_pods``)."""
BELOW_MIN_NODES: Final = "BelowMinNodes"
"""An elastic job that trained and now has fewer than ``minNodes`` nodes: it waits (Ready False), and after
``belowMinTimeoutSeconds`` fails with this reason, naming the shortfall."""
RESIZED: Final = "Resized"
"""An Event: an elastic job's Job resized in place (``decide.resize``)."""
ENDED_EARLY: Final = "EndedEarly"
"""An elastic job's attempt whose Job completed (its pods exited 0) while rank 0's report does not say the
training reached its last step: a gang restart from the checkpoint, counted against ``maxRestarts``
(``decide.ending``)."""
NOT_VERIFIED: Final = "NotVerified"
"""An elastic job whose rank 0 trained to the last step without its replicas verified (``onDivergence:
Warn`` found a divergence): the job fails, as it succeeds only verified (``decide.ending``)."""
SCALED: Final = contract.RESIZE_SCALED
"""``status.elastic.lastResize.reason`` when ``spec.nodes`` changed (kubectl scale, an HPA, an edit)."""
NODE_SILENT: Final = contract.RESIZE_SILENT
"""``lastResize.reason`` when the world shrank because a node went silent and was dropped."""
NODE_REJOINED: Final = contract.RESIZE_REJOINED
"""``lastResize.reason`` when the world grew without ``spec.nodes`` changing (a replacement, a woken node)."""
RESIZE_REASONS: Final = contract.RESIZE_REASONS
HEALED: Final = contract.RESIZE_HEALED
"""``status.elastic.lastResize.mode``: the survivors healed in place (``contract.RESIZE_MODES``)."""
RESTARTED: Final = contract.RESIZE_RESTARTED
"""``status.elastic.lastResize.mode``: the new world's workers restarted from the last checkpoint."""
"""Every reason of a resize: the status, the ``Resized`` event, ``ddpjob_elastic_resizes_total{reason}``."""

# -- Kueue (``observe.workloads``): the phase's reason while the Job is suspended for Kueue -----------------
KUEUE_PENDING: Final = "KueuePending"
"""Waiting for quota (or for Kueue to make the Workload at all)."""
KUEUE_INADMISSIBLE: Final = "KueueInadmissible"
"""Kueue cannot admit it as things are: the LocalQueue or its ClusterQueue is missing or stopped."""
KUEUE_PREEMPTED: Final = "KueuePreempted"
"""Kueue took the quota back for a higher-priority Workload; requeued."""
KUEUE_REQUEUED: Final = "KueueRequeued"
"""Kueue evicted it because its pods were not all ready in time (``waitForPodsReady``); requeued."""
KUEUE_EVICTED: Final = "KueueEvicted"
"""Kueue evicted it for another reason (a stopped queue, an admission check, deactivation)."""
KUEUE_ADMITTED: Final = "KueueAdmitted"
"""Admitted, and the Job not unsuspended yet (a moment)."""

# -- a pod that cannot start (``observe.startup``): the phase's and Ready's reason while the kubelet waits --
IMAGE_PULL_BACK_OFF: Final = "ImagePullBackOff"
"""The kubelet waits to pull an image again (its message says why the last pull failed, 1.32 on)."""
ERR_IMAGE_PULL: Final = "ErrImagePull"
"""The kubelet's pull of an image failed (a name the registry does not have, no credentials, no network)."""
INVALID_IMAGE_NAME: Final = "InvalidImageName"
"""An image reference that does not parse: it will never pull."""
ERR_IMAGE_NEVER_PULL: Final = "ErrImageNeverPull"
"""An image absent from the node under ``imagePullPolicy: Never``."""
CONFIG_ERROR: Final = "ConfigError"
"""The kubelet's ``CreateContainerConfigError``: a Secret or ConfigMap (or a key in one) that the
container's environment names is missing, or its securityContext cannot hold for the image."""
CONTAINER_ERROR: Final = "ContainerError"
"""The kubelet's ``CreateContainerError`` or ``RunContainerError``: the runtime could not create or start
the container (a mount, the command)."""
MOUNT_FAILED: Final = "FailedMount"
"""The kubelet cannot mount a volume of the pod (a Secret or ConfigMap a volume names is missing, say),
as its ``FailedMount`` event says."""
STARTUP_REASONS: Final = (
    IMAGE_PULL_BACK_OFF,
    ERR_IMAGE_PULL,
    INVALID_IMAGE_NAME,
    ERR_IMAGE_NEVER_PULL,
    CONFIG_ERROR,
    CONTAINER_ERROR,
    MOUNT_FAILED,
)
