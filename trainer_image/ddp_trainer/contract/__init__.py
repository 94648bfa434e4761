"""The contract between the operator and the trainer: the names and numbers that cross the pod boundary.

The operator (``ddp_operator``) renders pods and reads back what they report; the trainer
(``ddp_trainer``) runs in those pods. They ship as two images, so whatever one writes and the other reads
is defined here, once, and both import it: environment variable names and the attempt numbering, the
trainer's flags, the NCCL/torch defaults, the exit codes, the termination report's keys and the metric
names (those two in :mod:`.report` and :mod:`.metrics`, each name also here). This package imports nothing
but the standard library (the operator image has no torch), and ``tests/contract/test_contract.py``
renders a pod, runs a real trainer in its environment and reads the report back through the operator's
status, so a drift between the two halves fails a test.

Long because it is the one list of everything that crosses the boundary, each name with its meaning.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Final

# every name of the termination report and of the metrics is the contract's too (ddp_trainer.contract.X):
# each module is a part of this one, named apart so that a reader finds it
from ddp_trainer.contract.metrics import *  # noqa: F403
from ddp_trainer.contract.report import *  # noqa: F403

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
CHAOS_HEAL_NUDGE_ENV: Final = "DDPJOB_CHAOS_HEAL_NUDGE"
"""The fire drill of a heal in place (``DDPJOB_HEAL=1``), ``rank=R``: rank R of the healed world nudges one
parameter after the heal's state copy, before the healed world's replica check, at the first heal of the
first run of attempt 1 only: the check must refuse the heal, and the job restart in place from the last
checkpoint."""

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
HEALED_WORLD_LOG: Final = "(healed in place: "
"""What rank 0's :data:`ELASTIC_WORLD_LOG` line of a world healed in place says after ``before its first
step``, then the steps lost, the bytes sent and the seconds (``ddpjob local``'s summary marks the world
healed by it)."""

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
