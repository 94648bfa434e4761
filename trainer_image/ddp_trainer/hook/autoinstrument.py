"""Sync health with no code change: find the DDP model when it is built, count optimizer steps, and drive
the same :class:`ddp_trainer.sync.health.SyncHealth` the callbacks and the built-in trainer use.

:func:`install` runs once torch has loaded in a training process (the ``sitecustomize`` of
:mod:`ddp_trainer.hook.bootstrap` calls it; nothing else should). It

* wraps ``DistributedDataParallel.__init__``: each model is remembered (a weak reference) after DDP built
  it, with the line of the script that built it;
* registers PyTorch's global optimizer step hooks: at the first step of an optimizer that holds a DDP
  model's parameters (the pre-hook: all ranks are there, before the update) it builds ``SyncHealth``
  over every DDP model seen so far (the initial check, at step 0); after each step of that optimizer it
  calls ``SyncHealth.step()`` (a check every ``DDPJOB_SYNC_EVERY`` steps, the policy applied);
* finds an FSDP2 model (``fully_shard``) at the first step of an optimizer over DTensor parameters, among
  the live modules (FSDP2 has no constructor to wrap, and scripts import ``fully_shard`` by several
  names): an HSDP model (a 2-D mesh) is checked within each replica group; an FSDP model over a 1-D mesh
  has nothing replicated, which one line and the report say (reason ``FullyShardedNoReplicas``);
* wraps ``torch.distributed.destroy_process_group``: the final check and the report come before the
  group is gone; ``atexit`` does the same for a script that never destroys it, and an uncaught exception
  writes a ``Failed`` report.

It never changes training: it reads parameters and optimizer state, and copies rank 0's buffers only for
a model whose DDP wrapper copies them at every forward anyway (``broadcast_buffers``); the buffers of a
model that keeps them per rank are not compared. It stands down when the script builds ``SyncHealth``
itself (the object or a callback), so nothing is checked twice. A script with no DDP model runs untouched
and says so in one line. The total number of steps is not known here: progress shows the step and the
rate, no ETA. Long because each of these hooks needs its own guard against a user's script.
"""

from __future__ import annotations

import atexit
import functools
import gc
import os
import sys
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_trainer.core.wrappers import model_name

PREFIX = "ddpjob sync health"
_HOOK_FILES = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.path.dirname(torch.__file__))


def say(text: str) -> None:
    """One line on stderr, from global rank 0 only."""
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else os.environ.get("RANK", "0")
    if str(rank) == "0":
        print(f"{PREFIX}: {text}", file=sys.stderr, flush=True)


_LIBRARY_DIRS = ("site-packages", "dist-packages")
"""Installed packages (transformers, accelerate, lightning, ...): their frames are not the user's."""


def caller() -> str:
    """``file:line`` of the innermost frame of the user's own code: not torch, not this package, not an
    installed library (a Trainer builds DDP in accelerate's ``accelerator.py``; the line that matters is
    the script's ``trainer.train()``). The innermost frame outside torch and this package where every frame
    is a library's."""
    frames = [
        f
        for f in reversed(traceback.extract_stack())
        if not f.filename.startswith(_HOOK_FILES) and "<frozen" not in f.filename
    ]
    own = [f for f in frames if not any(os.sep + d + os.sep in f.filename for d in _LIBRARY_DIRS)]
    for frame in own or frames:
        return f"{os.path.basename(frame.filename)}:{frame.lineno}"
    return "?"


class Combined(nn.Module):
    """Several DDP models checked as one: ``ddp0.<name>``, ``ddp1.<name>``, ... (the inner modules)."""

    def __init__(self, models: list[nn.Module]) -> None:
        super().__init__()
        for i, model in enumerate(models):
            self.add_module(f"ddp{i}", model)


class AutoSync:
    """The hook's state in one process: the DDP models seen, then the ``SyncHealth`` that checks them."""

    def __init__(self) -> None:
        self.models: list[tuple[weakref.ref[DistributedDataParallel], str]] = []
        self.health: Any = None  # a SyncHealth once started (imported then: prometheus_client loads late)
        self.optimizer: weakref.ref[torch.optim.Optimizer] | None = None
        self.state = "waiting"  # waiting → checking → done, or off, or sharded (FSDP: nothing to compare)
        self.built_before = 0  # SyncHealth objects that existed when this one was built
        self.distributed = False  # a process group was seen (this is a training rank)

    # -- what the script does ---------------------------------------------------------------------------

    def built(self, model: DistributedDataParallel) -> None:
        """A DDP model was built."""
        self.distributed = True
        where = caller()
        if self.state == "waiting":
            self.models.append((weakref.ref(model), where))
        elif self.state == "checking":
            say(f"{model_name(model)} (DDP, built at {where}) came after the check started: not checked")

    def pre_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """Before an optimizer step: the first step of a DDP model's optimizer starts the check."""
        if self.state != "waiting":
            return
        models: list[tuple[nn.Module, str]] = [(m, w) for ref, w in self.models if (m := ref()) is not None]
        params = {id(p) for group in optimizer.param_groups for p in group["params"]}
        if not models or not any(id(p) in params for m, _ in models for p in m.parameters()):
            models = [(root, "found at its optimizer's first step") for root in fsdp_roots(optimizer)]
            if not models:
                return  # an optimizer of no DDP or FSDP2 model (or none yet)
        from ddp_trainer.sync import health, sharded

        layouts = [sharded.layout(m) for m, _ in models]
        if any(lay is not None and lay.group is None for lay in layouts):
            self.state = "sharded"
            self.distributed = True
            say(f"{sharded.FSDP_ONLY}: nothing was checked")
            return

        if not health.torch_version_ok(torch.__version__):
            self.state = "off"
            say(f"off: torch {torch.__version__} is older than the check needs ({health.MIN_TORCH})")
            return
        if health.SyncHealth.built:
            self.state = "off"
            say("the script checks its replicas itself (SyncHealth or its callback): the hook stands down")
            return
        self.start(models, optimizer, health)

    def start(self, models: list[tuple[nn.Module, str]], optimizer: Any, health: Any) -> None:
        inner = [m.module if isinstance(m, DistributedDataParallel) else m for m, _ in models]
        # DDP: buffers compared when its wrapper broadcasts them; HSDP: each replica's, which start equal
        buffers = all(bool(getattr(m, "broadcast_buffers", True)) for m, _ in models)
        model: nn.Module = models[0][0] if len(models) == 1 else Combined(inner)
        settings = health.SyncHealth.Config.from_env(
            broadcast_buffers=buffers and isinstance(models[0][0], DistributedDataParallel),
            check_buffers=buffers,
        )
        self.health = health.SyncHealth(model, optimizer, settings)  # the rest from the DDPJob's environment
        self.built_before = health.SyncHealth.built
        self.optimizer = weakref.ref(optimizer)
        self.state = "checking"
        self.health.close_on_uncaught_exception()
        names = ", ".join(
            (f"ddp{i} = " if len(models) > 1 else "")
            + f"{model_name(m)} ({where if 'found' in where else 'built at ' + where})"
            for i, (m, where) in enumerate(models)
        )
        layout = self.health.layout
        kind, how = ("DDP", "") if layout is None else (layout.kind, f" ({layout.describe()})")
        say(
            f"checking {len(models)} {kind} model(s): {names}{how}; every {self.health.every} steps of "
            f"{type(optimizer).__name__} (policy {self.health.policy})"
            + ("" if buffers else "; buffers are kept per rank (broadcast_buffers=False): not compared")
        )

    def post_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """After an optimizer step: count it (and check when due) if it is the counted optimizer."""
        if self.state != "checking" or self.optimizer is None or self.optimizer() is not optimizer:
            return
        from ddp_trainer.sync import health

        if health.SyncHealth.built > self.built_before:  # the script built its own after all
            self.state = "off"
            self.health.closed = True  # its report is the script's object's
            say("the script built its own SyncHealth: the hook stands down")
            return
        self.health.step()

    def finish(self) -> None:
        """The final check and the report, while the process group still exists."""
        if self.state == "checking":
            self.state = "done"
            self.health.close()

    def at_exit(self) -> None:
        """At exit: the final check where the group still exists (a verdict that fails sets the exit
        code, which an exit handler cannot otherwise change), or the one line for a process that trained
        no DDP model."""
        if self.state == "checking":
            from ddp_trainer.core import inplace

            self.state = "done"
            try:
                self.health.close(collective=dist.is_available() and dist.is_initialized())
            except SystemExit as stop:  # a divergence under Fail: the report is written
                inplace.exit_now(stop.code if isinstance(stop.code, int) else 1)
            except Exception as error:  # ranks that do not end together: the report says so
                print(f"{PREFIX}: {type(error).__name__}: {error}", file=sys.stderr)
                inplace.exit_now(1)
        elif self.state == "sharded":
            nothing_replicated_report()
        elif self.state == "waiting" and (self.distributed or "TORCHELASTIC_RUN_ID" in os.environ):
            if self.models:
                from ddp_trainer import contract

                say(contract.NOT_STEPPED_MESSAGE)
                _nothing_report(contract.NOT_STEPPED, contract.NOT_STEPPED_MESSAGE)
            else:
                say("no DDP model was seen in this process: nothing was checked")
                no_ddp_report()
        # the script's collectives and the final check's end before the interpreter: see settle_gloo
        if self.distributed or (dist.is_available() and dist.is_initialized()):
            from ddp_trainer.core.distributed import settle_gloo

            settle_gloo()


HOOK = AutoSync()


def fsdp_roots(optimizer: torch.optim.Optimizer) -> list[nn.Module]:
    """The outermost ``fully_shard`` modules whose parameters ``optimizer`` steps, found among the live
    objects (once: at its first step, and only when its parameters are DTensors)."""
    module_type = getattr(sys.modules.get("torch.distributed.fsdp"), "FSDPModule", None)
    if module_type is None:  # a script that never imported FSDP: nothing built at each of its steps
        return []
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not any(hasattr(p, "device_mesh") for p in params):
        return []
    ids = {id(p) for p in params}
    found = [obj for obj in gc.get_objects() if module_type in type(obj).__mro__]  # no __class__ lookups
    nested = {id(sub) for m in found for sub in m.modules() if sub is not m}
    return [m for m in found if id(m) not in nested and any(id(p) in ids for p in m.parameters())]


def no_ddp_report() -> None:
    """The pod's report when its local rank 0 trained no DDP model: nothing to verify (not "no report",
    which means it crashed before writing one). A report already there (a rank's failure) stays."""
    from ddp_trainer import contract

    _nothing_report(contract.NO_DDP_MODEL, contract.NO_DDP_MODEL_MESSAGE)


def nothing_replicated_report() -> None:
    """The pod's report when it trained an FSDP model over a 1-D mesh: no two ranks hold the same bytes."""
    from ddp_trainer import contract
    from ddp_trainer.sync import sharded

    _nothing_report(contract.FULLY_SHARDED, sharded.FSDP_ONLY)


def _nothing_report(reason: str, message: str) -> None:
    if os.environ.get("LOCAL_RANK", "0") != "0":
        return
    from ddp_trainer import contract
    from ddp_trainer.core import config
    from ddp_trainer.reporting import report

    world = int(os.environ.get("WORLD_SIZE", "1"))
    report.write_unless_reported(
        config.read_pod_env(os.environ).termination_log,
        {
            "result": contract.SUCCEEDED,
            "reason": reason,
            "message": message,
            "worldSize": world,
            "attempt": int(os.environ.get(contract.ATTEMPT_ENV, "1") or 1),
        },
    )


def _after_init(init: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(init)
    def wrapped(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        HOOK.built(self)

    return wrapped


def _before_destroy(destroy: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(destroy)
    def wrapped(group: Any = None, *args: Any, **kwargs: Any) -> Any:
        if group is None or group is dist.GroupMember.WORLD:
            HOOK.finish()
        return destroy(group, *args, **kwargs)

    return wrapped


def _safe(hook: Callable[..., None]) -> Callable[..., None]:
    """A hook whose own failure turns the check off instead of stopping training; the check's verdicts
    (a divergence under ``Fail``, ranks that do not check together) go on up, as they are meant to."""

    @functools.wraps(hook)
    def wrapped(*args: Any) -> None:
        try:
            hook(*args)
        except Exception as error:
            from ddp_trainer.sync.health import SyncHealthError

            if isinstance(error, SyncHealthError):
                raise
            HOOK.state = "off"
            say(f"off: {type(error).__name__}: {error}")

    return wrapped


def record_uncaught(kind: type[BaseException], error: BaseException) -> None:
    """An exception ends this rank: record it, with the time, in the pod's report, so the operator names
    the rank that failed first and its own error (its peers' "connection closed" come after it)."""
    initialized = dist.is_available() and dist.is_initialized()
    # SystemExit (a verdict's exit, or the script's) and Ctrl-C are no failure; nor is torchrun's agent
    # (no RANK) reporting its workers' (ChildFailedError): only a rank's own exception is recorded
    if (
        not issubclass(kind, Exception)
        or kind.__name__ == "ChildFailedError"
        or not (initialized or "RANK" in os.environ)
    ):
        return
    from ddp_trainer.core import config, inplace
    from ddp_trainer.reporting import report

    rank = dist.get_rank() if initialized else os.environ["RANK"]
    text = f"{kind.__name__}: {error}".strip()
    report.record_failure(
        config.read_pod_env(os.environ).termination_log,
        int(rank),
        text,
        restart=inplace.read_state(os.environ).restarts,
    )


def _chain_excepthook() -> None:
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, tb: Any) -> None:
        try:
            record_uncaught(kind, error)
        except Exception as failure:  # never hide the script's own exception
            say(f"could not record the failure: {type(failure).__name__}: {failure}")
        previous(kind, error, tb)

    sys.excepthook = hook


def install() -> None:
    """Wrap DDP's constructor and ``destroy_process_group``, register the optimizer step hooks and the
    exit handler, and give the ``ddp_trainer`` logger its own stderr handler (never the script's root
    logger: :mod:`ddp_trainer.reporting.logs`). Once per process; a torch without global step hooks
    leaves everything as it was."""
    if getattr(DistributedDataParallel.__init__, "__ddpjob_hook__", False):
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    from ddp_trainer.reporting import logs

    logs.configure(os.environ.get("RANK", "0"))  # the checks' lines on stderr, not in the script's own logs
    DistributedDataParallel.__init__ = _after_init(DistributedDataParallel.__init__)  # type: ignore[method-assign]
    DistributedDataParallel.__init__.__ddpjob_hook__ = True  # type: ignore[attr-defined]
    destroy = _before_destroy(dist.destroy_process_group)
    dist.destroy_process_group = destroy  # type: ignore[assignment]
    dist.distributed_c10d.destroy_process_group = destroy  # type: ignore[assignment]
    register_optimizer_step_pre_hook(_safe(HOOK.pre_step))
    register_optimizer_step_post_hook(_safe(HOOK.post_step))
    atexit.register(HOOK.at_exit)
    _chain_excepthook()
