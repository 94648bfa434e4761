"""Trainer configuration: command-line arguments (:class:`TrainerConfig`) and the pod environment
(:class:`PodEnv`). Both are frozen dataclasses with a docstring under each field; parsing is pure.

The operator renders ``torchrun --module ddp_trainer --device=… --backend=… --seed=… --steps=…
--batch-size=… --learning-rate=… --grad-accumulation=… --checkpoint-every=… --checkpoint-dir=…
--checkpoint-keep=… [--warm-start-from=…] --model=… --sync-every=… --on-divergence=…
--timeout-seconds=…``; every argument has a default, so
``torchrun --nproc-per-node 2 --module ddp_trainer --device=cpu`` runs on its own. Long because each flag
and each variable carries its docstring (``--help`` prints the flags').
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NoReturn, get_args, get_type_hints

from ddp_trainer import contract

Device = Literal["auto", "cuda", "cpu"]
Backend = Literal["auto", "nccl", "gloo"]
Policy = Literal["Fail", "Repair", "Warn"]
Precision = Literal["auto", "fp32", "bf16", "fp16"]


@dataclass(frozen=True)
class TrainerConfig:
    """What to train and how to verify it (from the command line)."""

    device: Device = "auto"
    """``cuda`` (one GPU per local rank), ``cpu``, or ``auto``: cuda when available."""
    backend: Backend = "auto"
    """Collective backend; ``auto`` is nccl on cuda and gloo on cpu."""
    seed: int = 0
    """Seed for model initialization (the same on every rank) and data order."""
    steps: int = 1000
    """Optimizer steps to train in total (a resumed run continues up to this step)."""
    batch_size: int = 32
    """Samples per micro-batch per rank."""
    learning_rate: float = 0.01
    """AdamW learning rate (constant)."""
    grad_accumulation: int = 1
    """Micro-batches per optimizer step; all but the last run under DDP's ``no_sync()``."""
    elastic_max_nodes: int = 0
    """An elastic job's largest size in nodes (``spec.elastic.maxNodes``; 0: not elastic). The global batch
    is then ``batch_size x grad_accumulation x processes per node x elastic_max_nodes`` samples at every
    world size: each rank takes its share of it, in micro-batches of at most ``batch_size``."""
    checkpoint_every: int = 100
    """Save a verified checkpoint every N steps when ``checkpoint_dir`` is set; 0 turns the schedule off
    (SIGTERM still saves one)."""
    checkpoint_dir: str = ""
    """Where checkpoints live; this job's newest intact one found here is restored at start (one written by
    another job or with other settings is refused). Empty: no checkpoints."""
    checkpoint_keep: int = 2
    """This job's newest checkpoints to keep (at least 1); older ones of this job are removed, other
    jobs' never."""
    warm_start_from: str = ""
    """A deliberate warm start: the name of another DDPJob (same namespace) whose newest checkpoint in
    ``checkpoint_dir`` seeds the model weights (step 0, fresh optimizer) when this job has none of its own.
    Empty: none."""
    model: str = "mlp"
    """A built-in model name (``mlp``) or a factory ``package.module:function`` taking this config."""
    dataset: str = "synthetic"
    """A built-in dataset name (``synthetic``) or a factory ``package.module:function`` taking this config."""
    sync_every: int = 100
    """Verify that all ranks hold the same model every N steps (and before step 1 and at the end)."""
    on_divergence: Policy = "Fail"
    """What a failed check does: ``Fail`` (exit 86 with the report), ``Repair`` (re-broadcast from rank 0,
    verify again, count the repair) or ``Warn`` (log, count, continue)."""
    timeout_seconds: int = 1800
    """Collective timeout given to ``init_process_group``: how long a rank waits for the others."""
    precision: Precision = "auto"
    """Mixed precision on cuda via ``torch.amp``: ``bf16``, ``fp16`` (with a GradScaler) or ``fp32``;
    ``auto`` is bf16 on cuda and fp32 on cpu."""

    def __post_init__(self) -> None:
        positive = (
            "steps",
            "batch_size",
            "grad_accumulation",
            "sync_every",
            "timeout_seconds",
            "checkpoint_keep",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"--{_flag(name)}={getattr(self, name)}: must be at least 1")
        if self.checkpoint_every < 0:
            raise ValueError(f"--checkpoint-every={self.checkpoint_every}: must be 0 (off) or positive")
        if not self.learning_rate > 0:
            raise ValueError(f"--learning-rate={self.learning_rate}: must be positive")

    def resolved_device(self, cuda_available: bool) -> Literal["cuda", "cpu"]:
        """The concrete device kind."""
        if self.device == "auto":
            return "cuda" if cuda_available else "cpu"
        return self.device

    def resolved_backend(self, device: str) -> Literal["nccl", "gloo"]:
        """The concrete backend for ``device``."""
        if self.backend == "auto":
            return "nccl" if device == "cuda" else "gloo"
        return self.backend

    def resolved_precision(self, device: str) -> Literal["fp32", "bf16", "fp16"]:
        """The concrete precision for ``device`` (autocast is used on cuda only)."""
        if self.precision == "auto":
            return "bf16" if device == "cuda" else "fp32"
        if device != "cuda" and self.precision != "fp32":
            raise ValueError(f"--precision={self.precision}: mixed precision needs --device=cuda")
        return self.precision


@dataclass(frozen=True)
class ChaosSpec:
    """The fire drill: rank ``rank`` nudges one parameter after optimizer step ``step``."""

    rank: int
    """Global rank that diverges."""
    step: int
    """Step after which it diverges."""


@dataclass(frozen=True)
class PodEnv:
    """What the operator puts in the pod environment besides the launcher's variables."""

    job: str = ""
    """``DDPJOB_NAME``: the DDPJob's name (metrics label ``job``)."""
    namespace: str = ""
    """``DDPJOB_NAMESPACE`` (metrics label ``namespace``)."""
    uid: str = ""
    """``DDPJOB_UID``: the DDPJob's uid; with namespace and name, the identity each checkpoint records."""
    attempt: int = contract.FIRST_ATTEMPT
    """``DDPJOB_ATTEMPT``: the gang-restart attempt, numbered from 1 (:data:`contract.FIRST_ATTEMPT`)."""
    metrics_port: int = contract.DEFAULT_METRICS_PORT
    """``DDPJOB_METRICS_PORT``: local rank 0 serves every local rank's metrics here; 0 disables."""
    termination_log: str | None = None
    """``DDPJOB_TERMINATION_LOG``: where the final report goes; default ``/dev/termination-log`` when
    writable, else nowhere (the report is always logged)."""
    chaos: ChaosSpec | None = None
    """``DDPJOB_CHAOS_DIVERGE="rank=R,step=S"``: the fire drill; unset in normal runs."""
    crash: ChaosSpec | None = None
    """``DDPJOB_CHAOS_CRASH="rank=R,step=S"``: the recovery drill (rank R dies by SIGKILL after step S in
    the first run of attempt 1); unset in normal runs."""
    sdc: ChaosSpec | None = None
    """``DDPJOB_CHAOS_SDC="rank=R,step=S"``: the silent-data-corruption drill (rank R computes wrong from
    step S on); unset in normal runs."""
    heal_nudge: int | None = None
    """``DDPJOB_CHAOS_HEAL_NUDGE="rank=R"``: the heal's drill (rank R of the healed world nudges one
    parameter before the healed world's check, which must refuse the heal); unset in normal runs."""
    node: str = ""
    """``DDPJOB_NODE_NAME``: the pod's node (the downward API's ``spec.nodeName``); empty outside a pod."""


def _flag(name: str) -> str:
    return contract.trainer_flag(name).removeprefix("--")


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass (used for ``--help``)."""
    docs: dict[str, str] = {}
    body = ast.parse(inspect.getsource(cls)).body[0]
    assert isinstance(body, ast.ClassDef)
    for node, after in zip(body.body, body.body[1:], strict=False):
        documented = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
        if documented and isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            assert isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
            docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs


class UsageExit(SystemExit):
    """argparse's exit on a bad command line (code :data:`contract.USAGE_EXIT_CODE`), with its message, so
    that the trainer can put it in its report."""

    def __init__(self, message: str) -> None:
        super().__init__(contract.USAGE_EXIT_CODE)
        self.message = message


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise UsageExit(message)


DESCRIPTION = (
    "The ddpjob trainer: seeded, broadcast-verified PyTorch DDP training that checks, bit for bit, that "
    "every rank holds the same model. Run it under torchrun: "
    "torchrun --nproc-per-node 2 --module ddp_trainer --device=cpu"
)


def build_parser() -> argparse.ArgumentParser:
    """An argparse parser with one ``--kebab-case`` flag per :class:`TrainerConfig` field."""
    parser = _Parser(prog="python -m ddp_trainer", description=DESCRIPTION)
    hints = get_type_hints(TrainerConfig)
    docs = field_docs(TrainerConfig)
    for f in dataclasses.fields(TrainerConfig):
        choices = get_args(hints[f.name])
        kind = str if choices else hints[f.name]
        parser.add_argument(
            f"--{_flag(f.name)}",
            dest=f.name,
            type=_canonical(choices) if choices else kind,
            choices=choices or None,
            default=f.default,
            help=f"{docs.get(f.name, '')} (default: {f.default!r})",
        )
    return parser


def _canonical(choices: Sequence[str]) -> Callable[[str], str]:
    by_lower = {c.lower(): c for c in choices}

    def convert(value: str) -> str:
        return by_lower.get(value.lower(), value)

    return convert


def parse_args(argv: Sequence[str]) -> TrainerConfig:
    """Parse ``argv`` (without the program name) into a validated config; exits on a usage error."""
    parser = build_parser()
    namespace = parser.parse_args(list(argv))
    try:
        return TrainerConfig(**vars(namespace))
    except ValueError as err:
        parser.error(str(err))


_CHAOS = re.compile(r"^\s*rank\s*=\s*(\d+)\s*,\s*step\s*=\s*(\d+)\s*$")


def parse_chaos(value: str, name: str = contract.CHAOS_ENV) -> ChaosSpec | None:
    """Parse ``"rank=R,step=S"`` (the variable ``name``'s value); empty means no drill. Raises
    ``ValueError`` naming the variable."""
    if not value.strip():
        return None
    match = _CHAOS.match(value)
    if not match:
        raise ValueError(f'{name}={value!r}: expected "rank=R,step=S", e.g. "rank=1,step=50"')
    return ChaosSpec(rank=int(match[1]), step=int(match[2]))


def parse_rank_drill(value: str, name: str = contract.CHAOS_HEAL_NUDGE_ENV) -> int | None:
    """Parse ``"rank=R"`` into R (empty: no drill); a ``ValueError`` names the variable ``name``."""
    if not value.strip():
        return None
    if not (match := re.match(r"^\s*rank\s*=\s*(\d+)\s*$", value)):
        raise ValueError(f'{name}={value!r}: expected "rank=R", e.g. "rank=1"')
    return int(match[1])


def _int_env(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer") from None


def termination_log(env: Mapping[str, str]) -> str | None:
    """Where this pod's report goes: ``DDPJOB_TERMINATION_LOG``, else the container's
    ``/dev/termination-log`` when it is writable, else nowhere."""
    termination = env.get(contract.TERMINATION_LOG_ENV) or None
    if termination is None and os.access(contract.TERMINATION_LOG_PATH, os.W_OK):
        termination = contract.TERMINATION_LOG_PATH
    return termination


def read_pod_env(env: Mapping[str, str]) -> PodEnv:
    """Read the ``DDPJOB_*`` variables from ``env`` (pass ``os.environ``); the filesystem is consulted only
    to see whether ``/dev/termination-log`` is writable when ``DDPJOB_TERMINATION_LOG`` is unset."""
    termination = termination_log(env)
    attempt = _int_env(env, contract.ATTEMPT_ENV, contract.FIRST_ATTEMPT)
    if attempt < contract.FIRST_ATTEMPT:
        raise ValueError(
            f"{contract.ATTEMPT_ENV}={attempt}: attempts are numbered from {contract.FIRST_ATTEMPT}"
        )
    return PodEnv(
        job=env.get(contract.JOB_NAME_ENV, ""),
        namespace=env.get(contract.JOB_NAMESPACE_ENV, ""),
        uid=env.get(contract.JOB_UID_ENV, ""),
        attempt=attempt,
        metrics_port=_int_env(env, contract.METRICS_PORT_ENV, contract.DEFAULT_METRICS_PORT),
        termination_log=termination,
        chaos=parse_chaos(env.get(contract.CHAOS_ENV, "")),
        crash=parse_chaos(env.get(contract.CHAOS_CRASH_ENV, ""), contract.CHAOS_CRASH_ENV),
        sdc=parse_chaos(env.get(contract.CHAOS_SDC_ENV, ""), contract.CHAOS_SDC_ENV),
        heal_nudge=parse_rank_drill(env.get(contract.CHAOS_HEAL_NUDGE_ENV, "")),
        node=env.get(contract.NODE_NAME_ENV, ""),
    )
