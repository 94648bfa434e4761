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
  not end a collective blocked on a silent peer: it returns at the group's timeout. Nor does giving up
  sooner help: after ``Work.wait(timeout)`` gave up on a pending gloo collective, ``abort()`` plus
  ``destroy_process_group()`` returned only at the group's timeout (8.01 s of an 8 s one, measured for
  issue 57's design). A heal waits for its own collectives to end (succeed or raise) and re-forms with
  nothing pending, which returns at once and fails a survivor still blocked on the old group at once.
  What does end a collective blocked on a silent peer: shutting the process's connections down from
  another thread (:func:`sever_connections`): with one of 3 ranks SIGSTOPped mid-run, the other two's DDP
  all-reduce raised "Connection closed by peer" within 10 ms of it (torch 2.15, gloo, CPU), which
  :func:`is_peer_loss` reads as a peer's loss, so a silent peer is healed like a lost one.
- Survivors need not fail the same collective: after a SIGKILL, a gloo broadcast from rank 0 completed on
  rank 1 and failed on rank 0; rank 1 then waited out the group's timeout in the next collective, rank 0
  having left for the new world. A heal tells the survivors of a loss; it does not wait for each to fail.
- ``distributed_c10d._reconfigure`` (experimental, private, "subject to change or removal") re-forms a gloo
  group made with ``enable_reconfigure=True`` in place, from the peers' handles; not used here.

A heal (:mod:`ddp_trainer.sync.heal`) meets on the store the new world's rank 0 hosts where the launcher's
notice says (:func:`bootstrap_store`, torch's own ``env://`` store, so a joiner started by the launcher meets
the survivors there), decides who sends the state (:func:`resume_plan`) and tells a peer's loss from other
errors (:func:`is_peer_loss`). Measured for the heal (torch 2.15, gloo, 3 processes, one SIGKILLed mid-run,
rank 0 or not): the survivors' DDP all-reduce raised a plain ``RuntimeError`` ("Connection reset by peer")
within 0.1 s, and ``abort()`` plus ``destroy_process_group()`` then returned at once (nothing pending). But
a survivor need not fail at all: one blocked on another survivor (not on the lost peer) waits until that one
closes its connections, which leaving the group does not do once DDP was built on it
(:func:`sever_connections` does).

The rank plans (:func:`survivor_world`, :func:`joiner_world`, :func:`resume_plan`) and the classifier are
pure; the rest calls torch. Long because the state copy's layout helpers live beside the copy.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
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


def sever_connections() -> int:
    """Shut down every established TCP connection of this process (``/proc``; none elsewhere); how many.
    For a worker that left its group after a peer's loss (:func:`abandon_group`): once a DDP wrapper was
    built on a gloo group, ``abort()`` and ``destroy_process_group()`` leave the group's connections open
    (measured, torch 2.15: a peer blocked on this process then failed only at the group's timeout, with or
    without the wrapper deleted; without DDP it failed within a second), so a survivor blocked on this one
    would wait out that timeout before it could heal. Its other connections (the old world's store, a
    scrape, a checkpoint bucket's pooled one) are dropped too: a client reconnects."""
    established: set[str] = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        established |= {row.split()[9] for row in rows if row.split()[3] == "01"}  # TCP_ESTABLISHED
    severed = 0
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return 0
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if not (target.startswith("socket:[") and target[8:-1] in established):
                continue
            with socket.socket(fileno=os.dup(int(fd))) as dup:  # closing the copy leaves the owner's fd
                dup.shutdown(socket.SHUT_RDWR)
            severed += 1
        except OSError:  # gone meanwhile, or not a socket any more
            continue
    return severed


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


def bootstrap_store(addr: str, port: int, rank: int, size: int, timeout: timedelta) -> Store:
    """The store of a new world as torch's ``env://`` start makes it (``rendezvous._create_c10d_store``
    without the agent's store): rank 0 hosts a multi-tenant libuv TCPStore at ``addr:port``, the others
    connect. Pair it with the prefix ``"default_pg"`` (:data:`DEFAULT_PREFIX`) and survivors that re-form
    and workers the launcher starts fresh in that world meet on one group, whoever is rank 0.

    The others connect once it listens (:func:`listening`): torch's client that comes 50 ms early backs off
    for 0.6 s (measured), and a heal's survivors read their notices at once, rank 0 no sooner than others."""
    if rank != 0:
        listening(addr, port, timeout.total_seconds())
    return dist.TCPStore(  # type: ignore[attr-defined]
        host_name=addr,
        port=port,
        world_size=size,
        is_master=rank == 0,
        timeout=timeout,
        multi_tenant=True,
        use_libuv=True,
    )


def listening(addr: str, port: int, seconds: float) -> bool:
    """Whether ``addr:port`` accepts a connection within ``seconds`` (tried every 10 ms; sends nothing)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((addr, port), timeout=1.0):
            return True
        time.sleep(0.01)
    return False


DEFAULT_PREFIX = "default_pg"
"""The prefix ``init_process_group`` puts on an ``env://`` store (distributed_c10d.py, "backward compatible
API")."""

PEER_LOSS = ("connection closed by peer", "connection reset by peer", "broken pipe", "connection refused")
"""What gloo says (its ``pair.cc``) when a peer's process is gone: its sockets were closed."""


def is_peer_loss(error: BaseException) -> bool:
    """Whether ``error`` (or one it was raised from or during) says a peer of a collective is gone: gloo's
    closed or reset connection (a plain ``RuntimeError``), or torch's ``DistNetworkError``. A timeout is not
    one (a silent peer is healed once its launcher asks the workers to sever their connections, which fails
    the collective with a closed connection, see above)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, dist.DistNetworkError):
            return True
        text = str(current).lower()
        if isinstance(current, RuntimeError) and any(words in text for words in PEER_LOSS):
            return True
        current = current.__cause__ or current.__context__
    return False


SURVIVOR, FRESH = "survivor", "fresh"


@dataclass(frozen=True)
class Arrival:
    """What one rank brings to a new world's meeting (its first collective): whether it trained in an
    earlier world (a survivor) or starts fresh, the last step it completed, its module's layout
    (:func:`layout_digest`), and whether it dropped a step in flight."""

    role: str
    step: int
    layout: str
    dropped: bool = False


@dataclass(frozen=True)
class Plan:
    """Where a new world resumes and who sends the state: ``step`` None when no rank survived (start as
    before heals: from the checkpoint); ``refused`` says why the state cannot come from a live rank."""

    step: int | None
    src: int | None = None
    receivers: tuple[int, ...] = ()
    lost: int = 0
    """The world's steps trained again: the step in flight (``step + 1``, begun by some rank and not
    completed by every survivor: a rank dropped it, or completed it while another did not), 0 or 1. A
    survivor that got one step further (a ring all-reduce the lost peer left half done) may have begun the
    step after that too; no world completed it, so it is not counted."""
    refused: str = ""


def resume_plan(arrivals: Sequence[Arrival]) -> Plan:
    """The plan from every rank's arrival (index = rank): resume at the lowest step a survivor completed;
    the lowest such rank sends; fresh ranks and survivors that got further receive. Refused when the layouts
    differ or the survivors are more than one step apart (no state both can reach)."""
    layouts = {a.layout for a in arrivals}
    if len(layouts) > 1:
        ranks = [r for r, a in enumerate(arrivals) if a.layout != arrivals[0].layout]
        return Plan(None, refused=f"rank(s) {ranks} hold a module of another layout than rank 0's")
    survivors = [(a.step, r) for r, a in enumerate(arrivals) if a.role == SURVIVOR]
    if not survivors:
        return Plan(None)
    low, src = min(survivors)
    high = max(step for step, _ in survivors)
    if high - low > 1:
        return Plan(None, refused=f"the survivors are at steps {low} to {high}: more than one step apart")
    receivers = tuple(r for r, a in enumerate(arrivals) if a.role != SURVIVOR or a.step != low)
    dropped = any(a.dropped for a in arrivals)
    return Plan(low, src, receivers, int(high > low or dropped))


def layout_digest(module: nn.Module) -> str:
    """A short digest of :func:`module_layout`: equal on ranks whose modules can exchange state."""
    return hashlib.sha256(repr(module_layout(module)).encode()).hexdigest()[:16]


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
    extra: Any = None
    """``src``'s ``extra`` (:func:`copy_state_`), on every rank."""


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
    extra: Any = None,
) -> Copied:
    """Make every rank of ``group`` (the default one if ``None``) hold rank ``src``'s parameters, buffers
    and optimizer state, bit for bit: broadcast in place into the module's tensors; the optimizer's state
    rebuilt from ``src``'s layout (a joiner's empty state gets its tensors) and loaded. Every rank calls it
    with a module of the same layout (refused otherwise, before any tensor is sent). ``extra``, any picklable
    of ``src``'s (its step, its scaler's state), travels with the layout and comes back in the result."""
    rank = dist.get_rank(group)
    ours = module_layout(module)
    sent: list[torch.Tensor] = []
    skeleton = _strip(optimizer.state_dict(), sent) if optimizer is not None and rank == src else None
    shared: list[Any] = [ours, skeleton, optimizer is not None, extra if rank == src else None]
    dist.broadcast_object_list(shared, src=src, group=group)
    theirs, skeleton, has_optimizer, extra = shared
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
    return Copied(len(moved), sum(t.numel() * t.element_size() for t in moved), extra)
