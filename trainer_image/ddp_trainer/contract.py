"""The contract between the operator and the trainer: the names and numbers that cross the pod boundary.

The operator (``ddp_operator``) renders pods and reads back what they report; the trainer
(``ddp_trainer``) runs in those pods. They ship as two images, so whatever one writes and the other reads
is defined here, once, and both import it: environment variable names and the attempt numbering, the
trainer's flags, the NCCL/torch defaults, the exit codes, the termination report's keys and the metric
names. This module imports nothing but the standard library (the operator image has no torch), and
``tests/contract/test_contract.py`` renders a pod, runs a real trainer in its environment and reads the report
back through the operator's status, so a drift between the two halves fails a test.

Long because it is the one list of everything that crosses the boundary, each name with its meaning.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Final, Literal, TypedDict

# -- the pod environment ------------------------------------------------------------------------------

# torchrun reads these (PET_<FLAG>); the operator sets them so that plain `torchrun script.py` works.
PET_NNODES: Final = "PET_NNODES"
PET_NPROC_PER_NODE: Final = "PET_NPROC_PER_NODE"
PET_NODE_RANK: Final = "PET_NODE_RANK"
PET_MASTER_ADDR: Final = "PET_MASTER_ADDR"
PET_MASTER_PORT: Final = "PET_MASTER_PORT"
# For scripts without torchrun (torchrun overwrites WORLD_SIZE and sets RANK itself).
MASTER_ADDR: Final = "MASTER_ADDR"
MASTER_PORT: Final = "MASTER_PORT"
NNODES: Final = "NNODES"
NODE_RANK: Final = "NODE_RANK"
WORLD_SIZE: Final = "WORLD_SIZE"
RANK: Final = "RANK"
"""Set (to the node rank) only when procsPerNode is 1, so that a plain ``python`` script's
``init_process_group()`` finds it; with more processes per pod only a launcher (torchrun) can set it."""
LOCAL_RANK: Final = "LOCAL_RANK"
"""0 when procsPerNode is 1, like :data:`RANK`."""
# The DDPJob's own variables.
JOB_NAME_ENV: Final = "DDPJOB_NAME"
"""The DDPJob's name."""
JOB_NAMESPACE_ENV: Final = "DDPJOB_NAMESPACE"
"""The DDPJob's namespace."""
JOB_UID_ENV: Final = "DDPJOB_UID"
"""The DDPJob's uid: with namespace and name, the identity every checkpoint records."""
ATTEMPT_ENV: Final = "DDPJOB_ATTEMPT"
"""The gang-restart attempt this pod belongs to: :data:`FIRST_ATTEMPT` for the first."""
METRICS_PORT_ENV: Final = "DDPJOB_METRICS_PORT"
"""Where local rank 0 serves every local rank's metrics; 0 disables the endpoint."""
TERMINATION_LOG_ENV: Final = "DDPJOB_TERMINATION_LOG"
"""Where the final report goes (default: the container's ``/dev/termination-log`` when writable)."""
CHAOS_ENV: Final = "DDPJOB_CHAOS_DIVERGE"
"""The fire drill, ``rank=R,step=S``: rank R nudges one parameter after step S."""
CHAOS_CRASH_ENV: Final = "DDPJOB_CHAOS_CRASH"
"""The recovery fire drill, ``rank=R,step=S``: rank R kills itself with SIGKILL after step S, in the first
run of attempt 1 only (so the restarted gang goes past S)."""
SYNC_EVERY_ENV: Final = "DDPJOB_SYNC_EVERY"
"""``spec.syncCheck.everySteps``: steps between periodic checks, for any command (``SyncHealth`` reads it;
the built-in trainer gets the same value as ``--sync-every``)."""
ON_DIVERGENCE_ENV: Final = "DDPJOB_ON_DIVERGENCE"
"""``spec.syncCheck.onDivergence``: ``Fail``, ``Repair`` or ``Warn``, for any command (as
``--on-divergence`` for the built-in trainer)."""
PROBE_EVERY_ENV: Final = "DDPJOB_PROBE_EVERY"
"""``spec.syncCheck.probeEverySteps``: steps between compute probes (0: off), for any command
(``SyncHealth`` reads it, in the built-in trainer too)."""
ON_FAULTY_RANK_ENV: Final = "DDPJOB_ON_FAULTY_RANK"
"""``spec.syncCheck.onFaultyRank``: ``Fail`` or ``Warn``, what a probe that names a faulty rank does."""
NODE_NAME_ENV: Final = "DDPJOB_NODE_NAME"
"""The pod's node (``spec.nodeName`` through the downward API): the probe names a faulty rank's node."""
CHAOS_SDC_ENV: Final = "DDPJOB_CHAOS_SDC"
"""The silent-data-corruption fire drill, ``rank=R,step=S``: rank R corrupts its local forward output
(one bit of one element, before the all-reduce) after step S; the replica check cannot see it, the compute
probe must name rank R."""

LAUNCH_STATE_ENV: Final = "DDPJOB_LAUNCH_STATE"
"""Set by the launcher (:mod:`ddp_trainer.launch`) for its workers: a JSON file in which it keeps the gang
restarts it did in place in this pod (:class:`LaunchState` keys), which the trainer reports."""
# torchrun's elastic agent, configured by the operator through its PET_ variables (see ``render``).
PET_RDZV_BACKEND: Final = "PET_RDZV_BACKEND"
PET_RDZV_ENDPOINT: Final = "PET_RDZV_ENDPOINT"
PET_RDZV_ID: Final = "PET_RDZV_ID"
PET_LOCAL_ADDR: Final = "PET_LOCAL_ADDR"
PET_MAX_RESTARTS: Final = "PET_MAX_RESTARTS"
RDZV_BACKEND: Final = "c10d"
"""The rendezvous torchrun's agents meet in. Not ``static``: with ``c10d`` an agent whose workers failed
re-opens the rendezvous, and every other node's agent sees the waiting node and restarts its own workers
(``static`` restarts only the node that failed; the others hang in their next collective)."""

RDZV_STORE_ENV: Final = "DDPJOB_RDZV_STORE"
"""``external``: no pod hosts the ``c10d`` rendezvous store, a process of its own does
(``python -m ddp_trainer.launch.store``), so any node of an elastic job, node 0 included, may leave."""
RDZV_STORE_EXTERNAL: Final = "external"
RIGID_RDZV_CONF: Final = "read_timeout=15"
"""A rigid job's rendezvous (torch's keep-alive, 5 s × 3): store reads time out after 15 s, not torch's 60,
so that an agent whose store host (node 0) went silent knows it within the 60 s a silent peer may cost a
rigid gang before it restarts (:mod:`ddp_trainer.launch.silence`)."""
SILENT_PEER: Final = "a peer went silent"
"""How a pod's report begins the failure of a rank stopped because a peer went silent (frozen, powered off,
cut off), so the operator and ``ddpjob local`` name it as that, not as an error of the user's command."""
ELASTIC_RDZV_CONF: Final = (
    "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=5,read_timeout=15"
)
"""An elastic job's rendezvous timing (torch's defaults: 30 s, 5 s, 3): a round closes 2 s after the
minimum joined, and a node whose agent stopped answering is dropped 5 s after its last keep-alive.

The short last call is safe because the nodes gather at the store before the first round
(``launch.store.gather``); without that, pods that start a second apart split the first round on a loaded
2-core machine. Later rounds start together (their agents poll the state every second).

The keep-alive bound is not shortened: an agent writes its keep-alive only when the last one is a full
interval old, so on a timer of 1 s the gap between two reaches 2 s. With a 2 s bound (tried, 2026-11-28)
the live survivors of a shrink were dropped as dead, the round emptied, and the lost node's replacement
formed a world of its own beside theirs: two worlds training at once, both saving checkpoints
(bench/RESULTS.md). 5 s leaves 3 s for a stalled agent. The same bound is what a survivor's agent reads to
find a member of its round that went silent (frozen, powered off, cut off) while the workers train:
:mod:`ddp_trainer.launch.silence`.

``read_timeout=15`` (torch's default: 60 s) bounds the one blocking wait of a round: the agents' exchange of
rank assignments right after it formed. A member that goes silent just as the round forms never writes its
part, and the others' wait ends after 15 s, not 60; the launcher then meets the next round without it."""


def log_stamp(at: float) -> str:
    """The time at the start of the trainer's and the launcher's log lines (``2026-11-28 02:33:22,101``, local
    time, as :mod:`logging` writes it): ``ddpjob local`` reads the elastic worlds back in time order by it."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) + f",{int(at % 1 * 1000):03d}"


ELASTIC_WORLD_LOG: Final = "elastic:"
"""How rank 0 of each world of an elastic job starts its log line ``elastic: world size W verified at step
S, ...``, once the new world holds its state and has passed its check (``ddpjob local`` lists them)."""

SYNC_HOOK_DIR: Final = "/ddpjob-sync"
"""Where the trainer container of a DDPJob with its own command finds the no-code-change hook
(``spec.syncCheck.autoInstrument``): an emptyDir that the init container fills with
``python -m ddp_trainer.inject`` (:data:`SYNC_HOOK_INSTALL`), first on the container's ``PYTHONPATH``."""
SYNC_HOOK_INSTALL: Final = ("python", "-m", "ddp_trainer.inject", SYNC_HOOK_DIR)
"""The init container's command (in the trainer image)."""
SYNC_HOOK_OFF_ENV: Final = "DDPJOB_SYNC_HOOK"
"""``0`` turns the hook off in one process (``ddp_trainer/hook/bootstrap/sitecustomize.py`` spells it too)."""
PYTHONPATH: Final = "PYTHONPATH"

TERMINATION_LOG_PATH: Final = "/dev/termination-log"
DEFAULT_METRICS_PORT: Final = 9400
DEFAULT_MASTER_PORT: Final = 29500

# -- attempts -----------------------------------------------------------------------------------------

FIRST_ATTEMPT: Final = 1
"""Attempts are numbered from 1: the Job of attempt N is ``<name>-N`` and ``DDPJOB_ATTEMPT`` is N."""


def restarts_before(attempt: int) -> int:
    """Gang restarts that happened before ``attempt`` began (0 for the first attempt)."""
    if attempt < FIRST_ATTEMPT:
        raise ValueError(f"attempt {attempt}: attempts are numbered from {FIRST_ATTEMPT}")
    return attempt - FIRST_ATTEMPT


# -- the trainer's command line -----------------------------------------------------------------------

LAUNCHER_MODULE: Final = "ddp_trainer.launch"
"""torchrun with the gang-restart bookkeeping: ``python -m ddp_trainer.launch`` takes torchrun's arguments."""
IMAGE_ENTRYPOINT: Final = ("python", "-m", LAUNCHER_MODULE)
"""The trainer image's ENTRYPOINT (the Dockerfile's): a DDPJob with ``args`` and no ``command`` runs
``python -m ddp_trainer.launch <args>`` (torchrun's arguments), in a cluster and in ``ddpjob local``."""
TRAINER_MODULE: Final = "ddp_trainer"
"""The built-in trainer: ``torchrun --module ddp_trainer <flags>``."""


def trainer_flag(field: str) -> str:
    """The command-line flag of a ``TrainerConfig`` field: ``sync_every`` → ``--sync-every``."""
    return "--" + field.replace("_", "-")


def trainer_argv(values: Mapping[str, object]) -> list[str]:
    """``--flag=value`` for each ``TrainerConfig`` field in ``values`` (floats keep every digit)."""
    return [
        f"{trainer_flag(name)}={value!r}" if isinstance(value, float) else f"{trainer_flag(name)}={value}"
        for name, value in values.items()
    ]


# Object storage (spec.checkpoint.s3): where the bucket is, and where the Secret's keys are mounted.
S3_ENDPOINT_ENV: Final = "DDPJOB_S3_ENDPOINT"
"""``spec.checkpoint.s3.endpoint``: the S3-compatible endpoint's URL (unset: AWS S3 itself)."""
S3_REGION_ENV: Final = "DDPJOB_S3_REGION"
"""``spec.checkpoint.s3.region`` (unset: the client asks the bucket)."""
S3_CREDENTIALS_ENV: Final = "DDPJOB_S3_CREDENTIALS"
"""A folder with the files :data:`S3_ACCESS_KEY_FILE` and :data:`S3_SECRET_KEY_FILE` (the Secret of
``spec.checkpoint.s3.credentialsSecret``, mounted read-only: never an environment variable). Unset, or the
files absent: the client's own chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``~/.aws``, an
instance or pod role)."""
S3_CREDENTIALS_DIR: Final = "/var/run/secrets/ddpjob.io/s3"
"""Where the operator mounts that Secret."""
S3_ACCESS_KEY_FILE: Final = "access-key-id"
S3_SECRET_KEY_FILE: Final = "secret-access-key"
S3_SCHEME: Final = "s3://"
"""``--checkpoint-dir s3://<bucket>/<prefix>``: checkpoints as objects
(``ddp_trainer.checkpoint.objectstore``)."""

# -- what a checkpoint records, and the spec fields that cannot change ----------------------------------
# Declared here once: ``provenance.settings_of`` records exactly RECORDED_SETTINGS' keys, the CRD fixes
# exactly FIXED_SPEC_FIELDS with CEL transition rules (``oldSelf``) and docs/operator.md lists the same
# table; tests/contract/test_fixed_fields.py fails, naming the field, when one of them lacks it.

RECORDED_SETTINGS: Final[dict[str, tuple[str, ...]]] = {
    "model": ("trainer.model",),
    "dataset": (),
    "seed": ("trainer.seed",),
    "batch_size": ("trainer.batchSize",),
    "grad_accumulation": ("trainer.gradAccumulation",),
    "learning_rate": ("trainer.learningRate",),
    "world_size": ("nodes", "procsPerNode"),
    "elastic_max_nodes": ("elastic", "elastic.maxNodes"),
    "precision": ("device",),
    "optimizer": (),
}
"""The settings every checkpoint records (the trainer refuses to resume under other values:
``SettingsChanged``) → the spec fields (paths under ``spec``) that decide them, fixed after creation so
that ``kubectl`` refuses the change at once. ``()``: no spec field sets it (``dataset`` is a trainer flag
the DDPJob API does not expose, ``optimizer`` the trainer's code)."""
CHECKPOINT_PLACE_FIELDS: Final = (
    "checkpoint",
    "checkpoint.volume",
    "checkpoint.volumeClaimTemplate",
    "checkpoint.s3",
    "checkpoint.mountPath",
    "checkpoint.warmStartFrom",
)
"""Spec fields fixed because the next attempt must find the checkpoints (``checkpoint``: not removed)."""
FIXED_SPEC_FIELDS: Final = (
    *(path for paths in RECORDED_SETTINGS.values() for path in paths),
    *CHECKPOINT_PLACE_FIELDS,
)
"""Every spec field that cannot change after creation (derived from the two above)."""
CHANGEABLE_TRAINER_SETTINGS: Final = frozenset(
    {"steps", "checkpoint_every", "checkpoint_dir", "checkpoint_keep", "sync_every", "on_divergence"}
    | {"timeout_seconds", "backend", "warm_start_from"}
)
"""Trainer flags the operator renders that a job may change between attempts (checkpoints do not record
them: a new schedule or step count is a legitimate way to continue)."""
RECORDED_FROM_FLAG: Final = {"device": "precision"}
"""Rendered trainer flags recorded under another name (the precision is resolved for the device)."""


# -- NCCL and torch.distributed -----------------------------------------------------------------------

CUBLAS_WORKSPACE_ENV: Final = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_WORKSPACE: Final = ":4096:8"
"""What cuBLAS needs, in the environment before it starts, to compute deterministically (the compute
probe runs under ``torch.use_deterministic_algorithms(True)``, which refuses cuBLAS without it): set on
GPU (NCCL) pods where the user did not set it, by ``ddpjob local`` through the same rendering, and by the
no-code hook."""

NCCL_ENV_DEFAULTS: Final[Mapping[str, str]] = {
    # A collective that times out tears the process down (3 = tear down without the CUDA-graph abort
    # race of 1): the pod fails, the operator restarts the gang, instead of ranks hanging forever.
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    # The flight recorder: what each rank was doing when a collective timed out.
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}
"""Set on NCCL jobs where the user did not set them: rendered into the pod by the operator and filled
in by the trainer when it runs outside a pod. ``spec.nccl.traceBufferSize`` overrides the buffer size
(0 turns the recorder and its dump off)."""

# -- exit codes ---------------------------------------------------------------------------------------

SUCCESS_EXIT_CODE: Final = 0
"""Training finished. The report's ``verified`` says whether every sync check passed (under ``Warn`` a
job can finish with mismatches)."""
FAILURE_EXIT_CODE: Final = 1
"""An error that is not a divergence: bad configuration, an exception in the model, a collective timeout."""
USAGE_EXIT_CODE: Final = 2
"""A bad command line (argparse's code): the same command can never succeed."""
DIVERGENCE_EXIT_CODE: Final = 86
"""The ranks stopped holding the same model and the policy was ``Fail`` (or a ``Repair`` did not take).
Reserved for divergence: nothing else in the trainer exits with 86."""
CHECKPOINT_REFUSED_EXIT_CODE: Final = 78
"""The checkpoint volume holds another job's checkpoint, or this job's written with other settings, or the
object store refused the trainer (report reason :data:`FOREIGN_CHECKPOINT`, :data:`SETTINGS_CHANGED` or
:data:`CHECKPOINT_STORAGE_REFUSED`): a configuration error that no restart can fix, so the operator fails the
DDPJob at once. 78 is ``EX_CONFIG`` of ``sysexits.h``; not argparse's 2, which other tools in a container exit
with for their own reasons."""
CONFIGURATION_EXIT_CODES: Final = (USAGE_EXIT_CODE, CHECKPOINT_REFUSED_EXIT_CODE)
"""Exit codes that mean "configuration": the same pod can never succeed, so the DDPJob fails at once without
using up gang restarts. The Indexed Job's ``podFailurePolicy`` says ``FailJob`` on them; ``ddpjob local``
follows the same rule (``ddp_operator.decide.restarts.decide``). torchrun exits 1 whatever its worker's
code, so the trainer also says it in its report (:data:`CONFIGURATION_REASONS`)."""
FAULTY_RANK_EXIT_CODE: Final = 87
"""The compute probe named a rank whose arithmetic differs from its peers' and ``onFaultyRank`` was
``Fail`` (report reason :data:`FAULTY_RANK`): the operator restarts the gang away from that rank's node."""
NOT_RETRIED_EXIT_CODES: Final = (*CONFIGURATION_EXIT_CODES, DIVERGENCE_EXIT_CODE, FAULTY_RANK_EXIT_CODE)
"""A worker that exits with one of these ends its pod at once, with the same code: the launcher never
restarts the gang in place for them (torchrun's agent would restart on any failure; a faulty rank must
restart away from its node)."""
INTERRUPTED_EXIT_CODE: Final = 143
"""SIGTERM (128 + 15): the trainer stopped at the next step boundary and saved a checkpoint. Non-zero on
purpose, so that a preempted pod is never counted as a finished one."""

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
ELASTIC_RESIZES: Final = "ddp_elastic_resizes"
"""The world changes this pod's launcher saw in this attempt (an elastic job's; every pod of the world
says its own count, so the highest is the best)."""
RESIZE_INFO: Final = "ddp_resize_info"
"""One series per world change this pod's launcher saw in this attempt (its last ``inplace.HISTORY``):
labels ``reason`` (:data:`RESIZE_REASONS`), ``from_nodes``, ``to_nodes`` and ``round`` (the rendezvous round
the new world formed in, the same on every pod of it; the highest is the last change); value: the Unix time
the earlier world stopped (the loss seen, the stop asked). The operator counts each round once, so a world
that lived between two of its readings is counted too."""
LAST_RESIZE_SECONDS_LOST: Final = "ddp_last_resize_seconds_lost"
"""Seconds from the earlier world's stop to the new world verified, before its first step."""
LAST_RESTART_INFO: Final = "ddp_last_restart_info"
"""Value: the in-place restart it describes; label ``cause``: the failing rank, exit code and first error, as
the pod whose agent saw it says (other pods say ``a rank on another node failed``)."""
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
