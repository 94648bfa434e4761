"""The termination report (part of :mod:`ddp_trainer.contract`): the results and reasons a trainer's
report says, its keys and its size limit, and how the operator reads it back (:func:`parse_report`).
Standard library only."""

from __future__ import annotations

import json
from typing import Final, Literal, TypedDict

# -- the termination report ---------------------------------------------------------------------------

Result = Literal["Succeeded", "Diverged", "Failed", "Interrupted"]
SUCCEEDED: Final = "Succeeded"
DIVERGED: Final = "Diverged"
FAILED: Final = "Failed"
INTERRUPTED: Final = "Interrupted"
FOREIGN_CHECKPOINT: Final = "ForeignCheckpoint"
"""Report reason: the newest intact checkpoint was written by another DDPJob (namespace, name or uid differ)
and ``spec.checkpoint.warmStartFrom`` does not name it."""
SETTINGS_CHANGED: Final = "SettingsChanged"
"""Report reason: this job's newest intact checkpoint was written with other settings (model, data order,
optimizer, world size, precision)."""
CHECKPOINT_STORAGE_REFUSED: Final = "CheckpointStorageRefused"
"""Report reason: the checkpoint storage refused the trainer (object storage: the credentials, the
bucket, access denied), before step 1; no restart can fix it."""
CHECKPOINT_REFUSED_REASONS: Final = (FOREIGN_CHECKPOINT, SETTINGS_CHANGED, CHECKPOINT_STORAGE_REFUSED)
"""Reasons that come with :data:`CHECKPOINT_REFUSED_EXIT_CODE`: fail at once, never restart."""
FAULTY_RANK: Final = "FaultyRank"
"""Report reason (result ``Failed``): the compute probe named a faulty rank under ``onFaultyRank: Fail``;
the report's ``faultyRanks``/``faultyNodes``/``faultyPods`` say where."""
NO_DDP_MODEL: Final = "NoDDPModel"
"""Report reason (result ``Succeeded``, no checks): the no-code hook saw no DDP model built in the pod's
local rank 0, so there was nothing to verify."""
NO_DDP_MODEL_MESSAGE: Final = "no DDP model was built in any rank: nothing to verify"
FULLY_SHARDED: Final = "FullyShardedNoReplicas"
"""Report reason (result ``Succeeded``, no checks): the no-code hook found an FSDP model sharded over a 1-D
mesh (``fully_shard``): every rank holds its own shard, so no two ranks hold the same parameters and there
is nothing to compare (the message says so and names FSDP; HSDP, a 2-D mesh, is checked)."""
NOT_STEPPED: Final = "NoOptimizerStep"
"""Report reason (result ``Succeeded``, no checks): the no-code hook saw a DDP model built in the pod's
local rank 0, but no optimizer stepped it (a run that resumed at its last epoch, an evaluation): nothing
was checked, and that is the reason the job gives, not a guess at why no report came."""
NOT_STEPPED_MESSAGE: Final = "a DDP model was built but no optimizer stepped it: nothing was checked"
NOTHING_TO_COMPARE: Final = (NO_DDP_MODEL, FULLY_SHARDED, NOT_STEPPED)
"""Report reasons of a run whose sync check had nothing to compare (the job's SyncVerified is Unknown)."""
SYNC_HOOK_OFF: Final = "SyncHookOff"
"""Report reason (result ``Succeeded``, no checks): the no-code hook could not switch on in the pod's
local rank 0; the message says why. Nothing was verified (distinct from "no report": a crash)."""
COMMAND_ERROR: Final = "CommandError"
"""Report reason: the user's own command raised (the no-code hook saw the exception end a rank)."""
INVALID_ARGUMENTS: Final = "InvalidArguments"
"""Report reason: the trainer refused its command line (it exits :data:`USAGE_EXIT_CODE`)."""
CONFIGURATION_REASONS: Final = (*CHECKPOINT_REFUSED_REASONS, INVALID_ARGUMENTS)
"""Report reasons that mean "configuration" (the report's side of :data:`CONFIGURATION_EXIT_CODES`): fail
at once, never restart."""
REPORT_LIMIT: Final = 4096
"""Bytes Kubernetes keeps of a termination message."""


class Report(TypedDict, total=False):
    """The trainer's final report: compact JSON in the termination message of each pod's local rank 0."""

    result: Result
    """How the run ended."""
    reason: str
    """CamelCase: ``AllChecksPassed``, ``RepairedDivergence``, ``DivergenceIgnored``, ``SyncDivergence``,
    ``RepairFailed``, ``Terminated``, ``TrainerError``, ``ForeignCheckpoint``, ``SettingsChanged``,
    ``InvalidArguments``."""
    message: str
    """One sentence for a person."""
    verified: bool
    """Every divergence found was repaired and the last check passed."""
    checks: int
    """Sync checks run."""
    mismatches: int
    """Checks that found ranks differing."""
    repairs: int
    """Divergences repaired by re-broadcasting from rank 0."""
    lastCheckStep: int
    """The step of the last check."""
    step: int
    """Optimizer steps done."""
    worldSize: int
    """Processes in the job."""
    mismatchedTensors: list[str]
    """Names of the tensors that differed at the last failed check (capped)."""
    mismatchedTensorsTruncated: bool
    """Whether names were cut to fit the termination message."""
    divergedRanks: list[int]
    """Ranks whose copy differed from the reference."""
    maxAbsDiff: float | str
    """Largest absolute difference found (a string for inf/nan, which JSON cannot hold)."""
    resumedFromStep: int
    """The checkpoint step this attempt resumed from (0: a fresh start)."""
    warmStartedFrom: str
    """The DDPJob (``namespace/name``) whose checkpoint seeded the weights of a deliberate warm start
    (present only then)."""
    skippedCheckpoints: list[str]
    """Checkpoints passed over at restore, each ``<file>: <why>`` (corrupt, or another job's; present only
    when there were any)."""
    attempt: int
    """The attempt that wrote the report (``DDPJOB_ATTEMPT``)."""
    modelDigest: str
    """A digest of rank 0's final fingerprint: equal digests mean bit-identical final models."""
    restartsInPlace: int
    """Gang restarts done in place (same pods) during this attempt (present only when there were any)."""
    lastRestart: str
    """Why the last in-place gang restart happened: the failing rank, its exit code and first error."""
    lastRestartFrom: str
    """Where that restart's workers took their state from (``contract.RESTART_FROM``)."""
    sharding: str
    """For an HSDP model, what was compared (``HSDP 2 x 2: each of 2 shards compared across its 2
    replicas``); absent for DDP."""
    probes: int
    """Compute probes run (present when the probe is on)."""
    probeVerdict: str
    """The last probe's verdict, one of :data:`PROBE_RESULTS` (present once a probe ran)."""
    probeWhy: str
    """Why, in a sentence: what the last probe saw (present with ``probeVerdict``)."""
    faultyRanks: list[int]
    """Ranks the compute probe named faulty (present only then)."""
    faultyNodes: list[str]
    """Their nodes (``DDPJOB_NODE_NAME``; ``""`` where unknown), in the order of ``faultyRanks``."""
    faultyPods: list[str]
    faultyDevices: list[str]
    """Their pods (``HOSTNAME``), in the same order."""
    failures: list[Failure]
    """The ranks of this pod that ended with an exception, the earliest first (present only then)."""
    earlierWorlds: EarlierWorlds
    """The sync checks of this attempt's earlier worlds in this pod (gang restarts in place, elastic
    resizes), which ``checks`` (this world's) leaves out (present only after such a world reported)."""
    writerPid: int
    """The process that wrote the report: another one's report in the file is an earlier world's."""


class EarlierWorlds(TypedDict, total=False):
    """What the earlier worlds of an attempt reported (:data:`REPORT_EARLIER_WORLDS`), added up."""

    worlds: int
    checks: int
    mismatches: int
    repairs: int
    resumedFromStep: int
    """The first of them's: where the attempt resumed."""


class Failure(TypedDict, total=False):
    """One rank's end by an exception, as that rank recorded it (``report.record_failure``)."""

    rank: int
    at: float
    """Unix time it was recorded: across pods, the earliest is the likely cause."""
    error: str
    """``Type: message`` of the exception."""
    restart: int
    """Gang restarts done in place before the run that failed."""


SYNC_STATUS_KEYS: Final = ("verified", "checks", "mismatches", "repairs", "lastCheckStep")
"""The report's keys that the operator copies into ``status.sync``."""
REPORT_RESTARTS_IN_PLACE: Final = "restartsInPlace"
"""The report's key of :attr:`Report.restartsInPlace`, which the operator and local mode read back (the
metric is :data:`RESTARTS_IN_PLACE`)."""
REPORT_LAST_RESTART: Final = "lastRestart"
"""The report's key of :attr:`Report.lastRestart`."""
REPORT_LAST_RESTART_FROM: Final = "lastRestartFrom"
"""The report's key of :attr:`Report.lastRestartFrom`."""
REPORT_EARLIER_WORLDS: Final = "earlierWorlds"
"""The report's key of :attr:`Report.earlierWorlds`: the trainer carries an attempt's checks over its
worlds in it, the operator and local mode add them to the report's own (``checks`` is one world's)."""
REPORT_WRITER: Final = "writerPid"
"""The report's key of :attr:`Report.writerPid`."""


def parse_report(text: str | None) -> Report | None:
    """The trainer's report from a termination message, or None when it is not one (a crash log)."""
    if not text:
        return None
    try:
        report = json.loads(text)
    except ValueError:
        return None
    if not isinstance(report, dict) or report.get("result") not in (SUCCEEDED, DIVERGED, FAILED, INTERRUPTED):
        return None
    return report  # type: ignore[return-value]
