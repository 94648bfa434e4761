"""The one module that reads the launcher environment and owns the process group.

torchrun (and the operator's pod environment) set ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (the node rank), ``MASTER_ADDR``/``MASTER_PORT``,
``TORCHELASTIC_RESTART_COUNT`` and ``TORCHELASTIC_RUN_ID``. :func:`process_group` picks the device, sets
NCCL/torch variables *before* ``init_process_group(timeout=…, device_id=…)`` and destroys the group in
``finally``. Without a launcher (no ``RANK``) it runs as a single rank on an in-memory store. Re-forming
a group in place, in a worker that outlived a peer, is :mod:`ddp_trainer.core.reform`'s (issue 57's heal,
not wired into the loop yet).
"""

from __future__ import annotations

import atexit
import os
import tempfile
import time
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from ddp_trainer import contract
from ddp_trainer.core import inplace


@dataclass(frozen=True)
class LaunchEnv:
    """Where this process sits in the job, as the launcher says."""

    rank: int = 0
    """Global rank (``RANK``)."""
    local_rank: int = 0
    """Rank within this pod/node (``LOCAL_RANK``); picks the GPU."""
    world_size: int = 1
    """Processes in the job (``WORLD_SIZE``)."""
    local_world_size: int = 1
    """Processes in this pod (``LOCAL_WORLD_SIZE``)."""
    node_rank: int = 0
    """This pod's index (``GROUP_RANK``, else ``NODE_RANK``)."""
    restart_count: int = 0
    """How often torchrun restarted the workers (``TORCHELASTIC_RESTART_COUNT``)."""
    launched: bool = False
    """Whether a launcher set ``RANK`` (otherwise: single process, in-memory store)."""


def read_launch_env(env: Mapping[str, str]) -> LaunchEnv:
    """Parse the launcher variables (pure: pass ``os.environ``)."""

    def num(*names: str, default: int) -> int:
        for name in names:
            if env.get(name, "").strip():
                return int(env[name])
        return default

    return LaunchEnv(
        rank=num("RANK", default=0),
        local_rank=num("LOCAL_RANK", default=0),
        world_size=num("WORLD_SIZE", default=1),
        local_world_size=num("LOCAL_WORLD_SIZE", default=1),
        node_rank=num("GROUP_RANK", "NODE_RANK", default=0),
        restart_count=num("TORCHELASTIC_RESTART_COUNT", default=0),
        launched=bool(env.get("RANK", "").strip()),
    )


def apply_env_defaults(env: MutableMapping[str, str], device: str) -> None:
    """Set the NCCL/torch variables the trainer relies on, unless the user set them."""
    if device == "cuda":
        for key, value in contract.NCCL_ENV_DEFAULTS.items():  # the user's environment wins
            env.setdefault(key, value)


def process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat``), or ``"0"`` where
    there is no ``/proc``: with the pid it names one process for as long as the machine is up."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "0"
    return stat[stat.rfind(")") + 2 :].split()[19]  # field 22; fields after the name start at 3


METRICS_DIR_PREFIX = "ddpjob-metrics-"
"""The start of the name of a metrics directory :func:`metrics_dir` made."""


def metrics_dir(env: MutableMapping[str, str], launch: LaunchEnv, anew: bool = False) -> Path:
    """Prepare ``PROMETHEUS_MULTIPROC_DIR``, shared by the local ranks of one torchrun agent.

    Must run before ``prometheus_client`` is imported. The directory is new for every agent process,
    worker restart and elastic world (keyed on the agent's pid, its start time, the restart count and
    the world changes its launcher counted), so no rank ever has to clear another's files. The start time
    matters where ``/tmp`` outlives processes (local mode, a shared host): a pid is reused, and a
    directory keyed on the pid alone would serve the series a dead process left there as this run's. The
    world matters because a world change starts new workers without a new restart count, and the files
    keep every series a dead worker wrote: ``ddp_info`` at 1 for the old world's size beside the new one,
    which a reader could not tell apart (the operator saw a world of 3 after it shrank to 1). ``anew``: a
    world healed in place (the same processes): the directory of the new world, where it was one of these
    (a directory the user set stays).
    """
    ours = Path(env.get("PROMETHEUS_MULTIPROC_DIR", "")).name.startswith(METRICS_DIR_PREFIX)
    if "PROMETHEUS_MULTIPROC_DIR" not in env or (anew and ours):
        # the worker's parent: torchrun's agent, or the agent's one fork server (the built-in trainer)
        agent = os.getppid() if launch.launched else os.getpid()
        world = inplace.read_state(env).resizes
        name = f"{METRICS_DIR_PREFIX}{agent}-{process_start(agent)}-{launch.restart_count}-{world}"
        env["PROMETHEUS_MULTIPROC_DIR"] = str(Path(tempfile.gettempdir()) / name)
    path = Path(env["PROMETHEUS_MULTIPROC_DIR"])
    path.mkdir(parents=True, exist_ok=True)
    return path


def pick_device(kind: str, launch: LaunchEnv) -> torch.device:
    """``cuda:<local rank>`` (set as the current device) or ``cpu``."""
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device=cuda but torch.cuda.is_available() is False; use --device=cpu")
        count = torch.cuda.device_count()
        if launch.local_rank >= count:
            raise RuntimeError(f"LOCAL_RANK={launch.local_rank} but only {count} GPU(s) are visible")
        device = torch.device("cuda", launch.local_rank)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


@contextmanager
def process_group(
    launch: LaunchEnv, backend: str, device: torch.device, timeout_seconds: int
) -> Iterator[None]:
    """Initialize the default process group for the whole ``with`` block; destroy it on the way out."""
    timeout = timedelta(seconds=timeout_seconds)
    device_id = device if device.type == "cuda" else None
    if launch.launched:
        dist.init_process_group(backend=backend, timeout=timeout, device_id=device_id)
    else:
        store = dist.HashStore()  # type: ignore[attr-defined]
        dist.init_process_group(
            backend, store=store, rank=0, world_size=1, timeout=timeout, device_id=device_id
        )
    try:
        yield
    finally:
        if dist.is_initialized():  # a worker that lost a peer left its group (ddp_trainer.sync.heal)
            dist.destroy_process_group()


GLOO_SETTLE_SECONDS: float = 0.2
"""How long a process that ran collectives waits, with the GIL released, before the interpreter's teardown.

torch's gloo worker threads (``pt_gloo_runloop``) drop their reference to a finished collective *after*
its caller has been woken; the last reference's destructor takes the GIL to release a Python object held
in the work's thread-local state. When the main thread is already finalizing the interpreter by then,
that thread is ended inside a destructor and the C++ runtime aborts the process ("terminate called
without an active exception", SIGABRT): a run that finished well exits -6 and fails its pod. Measured
here with torch 2.15 and plain torchrun (4 ranks, gloo, no ddpjob code at all): 4 of 10 runs of a
40-step DDP script aborted at exit, with or without ``destroy_process_group``; with this wait at exit, 0 of
24 (``pytorch/pytorch#179291`` is the upstream attempt; abandoned)."""

_settling = False


def settle_gloo() -> None:
    """Let gloo's worker threads release their last collectives while the interpreter is alive."""
    time.sleep(GLOO_SETTLE_SECONDS)


def settle_gloo_at_exit() -> None:
    """Once per process: :func:`settle_gloo` at exit, after the exit handlers registered later (which may
    still run a collective: a final check) and before those registered earlier."""
    global _settling
    if not _settling:
        _settling = True
        atexit.register(settle_gloo)
