"""Every phase, condition type and reason the operator writes: what ``kubectl get ddpj`` shows in its
PHASE and REASON columns, the ``status.conditions`` and the Events. One home, so a dashboard, an alert or
a user's script can rely on a name and a test can list them all. Values only."""

from __future__ import annotations

from typing import Final

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

# -- how an attempt ends, and what follows (``decide.restarts``) ------------------------------------------
COMPLETED: Final = "Completed"
GANG_RESTART: Final = "GangRestart"
PREEMPTED: Final = "Preempted"
"""A pod deleted gracefully or evicted (the trainer checkpointed at SIGTERM): a restart not counted."""
NODE_LOST: Final = "NodeLost"
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

# -- Kueue (``observe.kueue``): the phase's reason while the Job is suspended for Kueue ---------------------
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
