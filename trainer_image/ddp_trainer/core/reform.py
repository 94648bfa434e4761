"""Re-forming the default process group in place, the building block of a heal without a restart (issue
57): a worker that survives a peer's loss keeps its process, its module and its optimizer, and makes the
group of the new world (:func:`reform`); a joiner makes the same group and takes the model and optimizer
state from a live replica over it (:func:`copy_state_`), not from a checkpoint.

What torch 2.15 offers for this, tried on gloo/CPU (figures and how: bench/RESULTS.md, "Re-forming a
group in place"):

- ``ProcessGroup.abort()``, ``destroy_process_group()``, then ``init_process_group`` on a fresh
  ``PrefixStore`` of the same store, with the new rank and world size: works on gloo and NCCL, in a process
  whose peer was SIGKILLed or SIGSTOPped. This module uses it: public API only.
- ``torch.distributed.shrink_group``: ``TypeError`` on gloo (its backend has ``supports_shrinking`` false),
  with or without ``SHRINK_ABORT``; it cannot grow a group either.
- On gloo, ``abort()`` (of the group, of its backend, or ``_abort_process_group``) from another thread does
  not end a collective blocked on a silent peer: it returns at the group's timeout. A caller that waits on
  an async collective with ``Work.wait(timeout)`` can give up sooner and re-form while the old collective
  is still pending in the old group's threads (it ends at its own timeout).
- Survivors need not fail the same collective: after a SIGKILL, a gloo broadcast from rank 0 completed on
  rank 1 and failed on rank 0; rank 1 then waited out the group's timeout in the next collective, rank 0
  having left for the new world. A heal tells the survivors of a loss; it does not wait for each to fail.
- ``distributed_c10d._reconfigure`` (experimental, private, "subject to change or removal") re-forms a gloo
  group made with ``enable_reconfigure=True`` in place, from the peers' handles; not used here.

The rank plan (:func:`survivor_world`, :func:`joiner_world`) is pure; the rest calls torch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

if TYPE_CHECKING:  # torch's stubs name the store types only here; at run time: torch.distributed's
    from torch._C._distributed_c10d import Store

log = logging.getLogger("ddp_trainer")

BY_VALUE = 64
"""Optimizer-state tensors of at most this many elements (Adam's ``step``) travel pickled with the layout,
bit for bit, instead of one collective each (and stay on their own device, CPU for ``step``)."""


@dataclass(frozen=True)
class World:
    """One process's place in a world: its rank, the world's size, and the store prefix of its group."""

    rank: int
    size: int
    prefix: str
    """A prefix no earlier world of this store used (a generation: ``"world3"``)."""


def survivor_world(old_rank: int, old_size: int, lost: Collection[int], joiners: int, prefix: str) -> World:
    """A survivor's place in the next world: the survivors keep their order (rank 0 stays rank 0 unless it
    was lost), the ``joiners`` take the ranks after them."""
    if not 0 <= old_rank < old_size or any(not 0 <= r < old_size for r in lost):
        raise ValueError(f"ranks out of a world of {old_size}: rank {old_rank}, lost {sorted(lost)}")
    if old_rank in lost:
        raise ValueError(f"rank {old_rank} is lost, not a survivor")
    if joiners < 0:
        raise ValueError(f"joiners must be ≥ 0, not {joiners}")
    gone = set(lost)
    below = sum(1 for r in range(old_rank) if r not in gone)
    return World(below, old_size - len(gone) + joiners, prefix)


def joiner_world(index: int, survivors: int, joiners: int, prefix: str) -> World:
    """The place of joiner ``index`` (0-based) in a world of ``survivors`` plus ``joiners`` processes."""
    if survivors < 0 or not 0 <= index < joiners:
        raise ValueError(f"joiner {index} of {joiners} after {survivors} survivors")
    return World(survivors + index, survivors + joiners, prefix)


def abandon_group() -> bool:
    """Abort and destroy the default group, if there is one (whether it works or a peer is gone); whether
    there was one. Collectives in flight on it fail; on gloo, one blocked on a silent peer only at its
    timeout (see the module's docstring)."""
    if not dist.is_initialized():
        return False
    group = dist.group.WORLD
    if group is not None:
        group.abort()
    dist.destroy_process_group()
    return True


def reform(
    store: Store,
    world: World,
    *,
    backend: str = "gloo",
    timeout: timedelta = timedelta(seconds=60),
    device_id: torch.device | None = None,
) -> dist.ProcessGroup:
    """In this process, abandon the default group (if any) and make the one of ``world`` on ``store`` under
    ``world.prefix``. Waits up to ``timeout`` for the world's other ranks to join (and the new group's
    collectives time out after it); says so on stderr first. The caller wraps DDP again around its module:
    the old wrapper's reducer belongs to the old group."""
    had = abandon_group()
    log.warning(
        "re-forming the process group%s: rank %d of %d (%s) on store prefix %r; waiting up to %.0f s for "
        "the other %d rank(s) to join",
        " (old one aborted)" if had else "",
        world.rank,
        world.size,
        backend,
        world.prefix,
        timeout.total_seconds(),
        world.size - 1,
    )
    started = time.perf_counter()
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(world.prefix, store),  # type: ignore[attr-defined]
        rank=world.rank,
        world_size=world.size,
        timeout=timeout,
        device_id=device_id,
    )
    group = dist.group.WORLD
    assert group is not None
    log.info("process group re-formed at world %d in %.3f s", world.size, time.perf_counter() - started)
    return group


@dataclass(frozen=True)
class _Slot:
    """Where a tensor of the optimizer's state sits in its layout: sent apart, or held here by value."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    value: torch.Tensor | None


@dataclass(frozen=True)
class Copied:
    """What :func:`copy_state_` sent: tensors by collective, and their bytes (the layout's pickle aside)."""

    tensors: int
    bytes: int


def _strip(obj: Any, sent: list[torch.Tensor]) -> Any:
    """``obj`` (an optimizer's state dict) with each tensor replaced by a :class:`_Slot`; the large ones are
    appended to ``sent`` in the order of the slots."""
    if isinstance(obj, torch.Tensor):
        if obj.numel() <= BY_VALUE:
            return _Slot(tuple(obj.shape), obj.dtype, obj.detach().clone())
        sent.append(obj)
        return _Slot(tuple(obj.shape), obj.dtype, None)
    if isinstance(obj, dict):
        return {k: _strip(v, sent) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_strip(v, sent) for v in obj)
    return obj


def _fill(obj: Any, received: Iterator[torch.Tensor]) -> Any:
    """The inverse of :func:`_strip`, the large tensors taken from ``received`` in order."""
    if isinstance(obj, _Slot):
        return obj.value if obj.value is not None else next(received)
    if isinstance(obj, dict):
        return {k: _fill(v, received) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_fill(v, received) for v in obj)
    return obj


def _slots(obj: Any) -> Iterator[_Slot]:
    if isinstance(obj, _Slot):
        if obj.value is None:
            yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _slots(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from _slots(v)


def module_layout(module: nn.Module) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """Every parameter and buffer of ``module`` (non-persistent buffers too): name, shape, dtype."""
    named = [*module.named_parameters(), *module.named_buffers()]
    return [(name, tuple(t.shape), t.dtype) for name, t in named]


def copy_state_(
    module: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    src: int = 0,
    group: dist.ProcessGroup | None = None,
) -> Copied:
    """Make every rank of ``group`` (the default one if ``None``) hold rank ``src``'s parameters, buffers
    and optimizer state, bit for bit: broadcast in place into the module's tensors; the optimizer's state
    rebuilt from ``src``'s layout (a joiner's empty state gets its tensors) and loaded. Every rank calls it
    with a module of the same layout (refused otherwise, before any tensor is sent)."""
    rank = dist.get_rank(group)
    ours = module_layout(module)
    sent: list[torch.Tensor] = []
    skeleton = _strip(optimizer.state_dict(), sent) if optimizer is not None and rank == src else None
    shared: list[Any] = [ours, skeleton, optimizer is not None]
    dist.broadcast_object_list(shared, src=src, group=group)
    theirs, skeleton, has_optimizer = shared
    if theirs != ours:
        diff = next((a, b) for a, b in zip([*ours, None], [*theirs, None], strict=False) if a != b)
        raise ValueError(f"rank {rank}'s module differs from rank {src}'s: {diff[0]} here, {diff[1]} there")
    if has_optimizer != (optimizer is not None):
        raise ValueError(f"rank {src} {'has' if has_optimizer else 'has no'} optimizer; rank {rank} not")
    tensors = [t.detach() for _, t in [*module.named_parameters(), *module.named_buffers()]]
    if optimizer is not None and rank != src:
        device = tensors[0].device if tensors else torch.device("cpu")
        sent = [torch.empty(s.shape, dtype=s.dtype, device=device) for s in _slots(skeleton)]
    with torch.no_grad():
        for t in [*tensors, *sent]:
            dist.broadcast(t, src=src, group=group)
    if optimizer is not None and rank != src:
        optimizer.load_state_dict(_fill(skeleton, iter(sent)))
    moved = [*tensors, *sent]
    return Copied(len(moved), sum(t.numel() * t.element_size() for t in moved))
