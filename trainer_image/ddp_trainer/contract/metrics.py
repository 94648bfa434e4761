"""The trainer's metrics (part of :mod:`ddp_trainer.contract`): their names and labels, the causes a
restart is blamed on, the elastic resize reasons, the compute probe's results and the sync checks'
results and kinds, as the operator and the dashboards read them. Standard library only."""

from __future__ import annotations

from typing import Final

# -- metrics ------------------------------------------------------------------------------------------

RANK_LABEL: Final = "rank"
NODE_RANK_LABEL: Final = "node_rank"
JOB_LABEL: Final = "ddpjob"
"""The DDPJob's name. Not ``job``: Prometheus sets ``job`` (the scrape job) and, under the Prometheus
Operator, ``namespace`` and ``pod`` on every target, and with the default ``honor_labels: false`` a
scraped label of the same name is renamed ``exported_<name>``, which breaks every query on it."""
NAMESPACE_LABEL: Final = "ddpjob_namespace"
"""The DDPJob's namespace (equal to the pod's ``namespace`` in a cluster; local mode has no pod)."""
METRIC_LABELS: Final = (JOB_LABEL, NAMESPACE_LABEL, RANK_LABEL, NODE_RANK_LABEL)
"""Every trainer series carries these labels, so that jobs stay apart with default scrape settings, in a
cluster and in local mode alike."""

# Family names as registered; prometheus-client exposes a counter ``x`` as the sample ``x_total``.
INFO: Final = "ddp_info"
STEP: Final = "ddp_step"
STEPS: Final = "ddp_steps"
STEP_DURATION: Final = "ddp_step_duration_seconds"
SAMPLES: Final = "ddp_samples"
LOSS: Final = "ddp_loss"
SYNC_CHECKS: Final = "ddp_sync_checks"
SYNC_CHECK_DURATION: Final = "ddp_sync_check_duration_seconds"
SYNC_MISMATCHED_TENSORS: Final = "ddp_sync_mismatched_tensors"
SYNC_MAX_ABS_DIVERGENCE: Final = "ddp_sync_max_abs_divergence"
SYNC_REPAIRS: Final = "ddp_sync_repairs"
SYNC_RANK_DIVERGED: Final = "ddp_sync_rank_diverged"
"""1 while the last sync check named this rank among those whose model differs from the rest, else 0: what
lets an alert name the diverged rank (every rank counts the mismatch in ``ddp_sync_checks_total``)."""
SYNC_LAST_CHECK_TIMESTAMP: Final = "ddp_sync_last_check_timestamp_seconds"
SYNC_LAST_CHECK_OK: Final = "ddp_sync_last_check_ok"
SYNC_LAST_CHECK_STEP: Final = "ddp_sync_last_check_step"
SYNC_EVERY_STEPS: Final = "ddp_sync_every_steps"
TOTAL_STEPS: Final = "ddp_total_steps"
"""The run's total optimizer steps where the code knows it (0: not known); progress and ETA prefer it to
``spec.trainer.steps``, which only the built-in trainer reads."""
SYNC_LAST_SUCCESS_TIMESTAMP: Final = "ddp_sync_last_success_timestamp_seconds"
LAST_STEP_TIMESTAMP: Final = "ddp_last_step_timestamp_seconds"
STEP_TIME_SKEW: Final = "ddp_step_time_skew_ratio"
NONFINITE_LOSS_STEPS: Final = "ddp_nonfinite_loss_steps"
RESTARTS: Final = "ddp_restarts"
RESTARTS_IN_PLACE: Final = "ddp_restarts_in_place"
"""Gang restarts done in place in this attempt (every pod restarts together, so every pod says the same)."""
OTHER_NODE_FAILED: Final = "a rank on another node failed"
"""The restart cause a pod states when its agent restarted because another node's agent re-opened the
rendezvous (only the failing node's agent saw the failure)."""
COLLATERAL_ERRORS: Final = (
    "Connection reset",
    "Connection closed",
    "connectFullMesh",
    "Broken pipe",
    "Connection refused",
    "timed out",
    "Timeout",
    "NCCL communicator was aborted",
    "DistNetworkError",
)
"""Words of an error a rank gets because a peer died (seen through a collective): the peer is the cause."""


def blame(cause: str) -> tuple[int, str]:
    """Sort key for restart causes (``rank R killed by signal S`` / ``rank R exited C: error``), most
    likely first: a death by a signal other than SIGTERM (the agent's own), then an error of the rank's
    own, then an error caused by a dead peer, then :data:`OTHER_NODE_FAILED`."""
    if cause == OTHER_NODE_FAILED or not cause:
        return (3, cause)
    if " killed by signal " in cause and " killed by signal 15" not in cause:
        return (0, cause)
    return (2 if any(word in cause for word in COLLATERAL_ERRORS) else 1, cause)


RESIZE_SCALED: Final = "Scaled"
"""Why an elastic job's world changed: ``spec.nodes`` changed (``kubectl scale``, an HPA, an edit). Only the
operator knows this one: it resized the Job; the launchers see a node leave or join."""
RESIZE_LOST: Final = "NodeLost"
"""Why an elastic world shrank: a node's processes ended (its pod deleted, evicted or failed, a crash the
others saw through a collective), or it left at a step boundary."""
RESIZE_SILENT: Final = "NodeSilent"
"""Why an elastic world shrank: a node went silent (frozen, powered off, cut off) and was dropped past the
keep-alive bound (:mod:`ddp_trainer.launch.silence`)."""
RESIZE_REJOINED: Final = "NodeRejoined"
"""Why an elastic world grew without ``spec.nodes`` changing: a replacement pod, or a node dropped as silent
that woke, joined at a step boundary."""
RESIZE_REASONS: Final = (RESIZE_SCALED, RESIZE_LOST, RESIZE_SILENT, RESIZE_REJOINED)
"""Every reason of an elastic resize: ``status.elastic.lastResize.reason``, the ``Resized`` event, the
operator's ``ddpjob_elastic_resizes_total{reason}`` and the launcher's :data:`RESIZE_INFO` (which never
says :data:`RESIZE_SCALED`)."""
RESIZE_HEALED: Final = "healed"
"""How an elastic world changed: its survivors kept their processes and re-formed their group in place
(``DDPJOB_HEAL=1``), the state in memory, verified before the first healed step."""
RESIZE_RESTARTED: Final = "restarted"
"""How an elastic world changed: its workers were started anew and resumed from the last checkpoint (a grow,
a heal refused or not asked for)."""
RESIZE_MODES: Final = (RESIZE_HEALED, RESIZE_RESTARTED)
"""How a world change was made: ``status.elastic.lastResize.mode``, the ``Resized`` event and the
launcher's :data:`RESIZE_INFO` ``mode`` label (absent from an older trainer's: restarted)."""
ELASTIC_RESIZES: Final = "ddp_elastic_resizes"
"""The world changes this pod's launcher saw in this attempt (an elastic job's; every pod of the world
says its own count, so the highest is the best)."""
RESIZE_INFO: Final = "ddp_resize_info"
"""One series per world change this pod's launcher saw in this attempt (its last ``inplace.HISTORY``):
labels ``reason`` (:data:`RESIZE_REASONS`), ``from_nodes``, ``to_nodes``, ``round`` (the rendezvous round
the new world formed in, the same on every pod of it; the highest is the last change) and ``mode``
(:data:`RESIZE_MODES`); value: the Unix time the earlier world stopped (the loss seen, the stop asked). The
operator counts each round once, so a world that lived between two of its readings is counted too."""
LAST_RESIZE_SECONDS_LOST: Final = "ddp_last_resize_seconds_lost"
"""Seconds from the earlier world's stop to the new world verified, before its first step."""
LAST_RESIZE_STEPS_LOST: Final = "ddp_last_resize_steps_lost"
"""A world healed in place (issue 57): the steps its survivors trained that no rank kept (the step in flight
at a loss, 0 for a grow agreed at a step boundary). Absent for a world whose workers restarted."""
LAST_RESIZE_BYTES_SENT: Final = "ddp_last_resize_bytes_sent"
"""A world healed in place: the bytes of state a live replica sent over the process group to the ranks that
needed it (a joiner, a survivor a step ahead; 0 when none did). Absent for a world whose workers restarted."""
LAST_RESTART_INFO: Final = "ddp_last_restart_info"
"""Value: the in-place restart it describes; label ``cause``: the failing rank, exit code and first error, as
the pod whose agent saw it says (other pods say ``a rank on another node failed``); label
:data:`RESTART_FROM_LABEL`: where the restarted workers' state comes from."""
RESTART_FROM_LABEL: Final = "state_from"
RESTART_FROM_CHECKPOINT: Final = "checkpoint"
"""The restarted workers restore the last checkpoint (a job that does not heal, or a refused heal)."""
RESTART_FROM_OTHERS: Final = "others"
"""The restarted workers' launcher heals (issue 57): they join the others, which heal in place, and copy
their state from a live replica where one is there (else they too restore the last checkpoint)."""
RESTART_FROM: Final = (RESTART_FROM_CHECKPOINT, RESTART_FROM_OTHERS)
PROBES: Final = "ddp_probes"
"""Compute probes by ``result`` (:data:`PROBE_RESULTS`)."""
PROBE_FAULTY: Final = "ddp_probe_faulty"
"""1 while the last probe named this rank faulty (labels ``node``, ``pod``: where it runs), else 0."""
PROBE_FLAKY: Final = "ddp_probe_flaky"
"""1 while the last probe named this rank flaky (it did not reproduce its own result), else 0."""
PROBE_DURATION: Final = "ddp_probe_duration_seconds"
PROBE_EVERY_STEPS: Final = "ddp_probe_every_steps"
PROBE_LAST_TIMESTAMP: Final = "ddp_probe_last_timestamp_seconds"
PROBE_RESULTS: Final = ("agree", "faulty", "flaky", "undecidable")
NODE_LABEL: Final = "node"
POD_LABEL: Final = "pod_name"
"""Not ``pod``: the Prometheus Operator sets ``pod`` on every target (see :data:`JOB_LABEL`)."""
CHECK_RESULT_OK: Final = "ok"
CHECK_RESULT_MISMATCH: Final = "mismatch"
CHECK_RESULTS: Final = (CHECK_RESULT_OK, CHECK_RESULT_MISMATCH)
CHECK_KINDS: Final = ("initial", "periodic", "final", "repair")
"""``ddp_sync_checks_total{kind,result}``: every combination exists from the start, at 0."""
METRICS_PORT_NAME: Final = "metrics"
"""The name of the trainer container's (and the operator's) metrics port, which the monitors select."""


def counter_sample(family: str) -> str:
    """The exposed sample name of a counter family: ``ddp_steps`` → ``ddp_steps_total``."""
    return family + "_total"
