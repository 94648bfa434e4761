"""The round a heal meets (issue 57): who is alive to meet it, and torch's rendezvous closing it as soon as
they joined, not after its last call (:mod:`ddp_trainer.launch.heal_round` runs the heal).

A healer names itself in the store before it leaves its round (:func:`say_healing`), and counts the nodes
alive (:func:`members_alive`: fresh keep-alives and the named healers) as the :class:`Meeting` of the next
round; :func:`closing_at` makes torch's handler close that round once that many joined
(:func:`closing_when_full`: whichever healer joined first), with a longer last call for a grow's joiner.
All of it reads or bends torch's private rendezvous state and settings, pinned by
``tests/contract/test_torch_private.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

HEALERS_PREFIX = "ddpjob/healers"


def healers_key(run_id: str, round_: int) -> str:
    """The store key that names the nodes leaving round ``round_`` of rendezvous ``run_id`` to heal."""
    return f"{HEALERS_PREFIX}/{run_id}/{round_}"


def say_healing(watch: Any | None, round_: int) -> None:
    """Name this node in the store as one that leaves round ``round_`` to heal, before it leaves torch's
    state (:func:`members_alive`); a store that cannot take it leaves the count to the keep-alives."""
    if watch is not None:
        with contextlib.suppress(Exception):
            watch.store.append(healers_key(watch.run_id, round_), f"{watch.handler._this_node};")


@dataclasses.dataclass(frozen=True)
class Meeting:
    """The round a heal meets, as the state read when it begins says: ``nodes`` agents alive, ``joining``
    when one of them waits to join and heals from no round of its own (a grow)."""

    nodes: int
    joining: bool


def members_alive(watch: Any | None, round_: int | None = None) -> Meeting | None:
    """The agents of the rendezvous alive: those that renew their keep-alive (``watch``'s read of torch's
    state: one whose process ended was marked expired by the store at once, a silent one expired by the
    bound), whether still in the last round's participants or already waiting for the next, and those that
    named themselves healers leaving round ``round_`` (:func:`say_healing`): a node on its way from one
    round to the next is in neither list for a moment (torch's exit takes its keep-alive away, its join
    gives it back), and a survivor that read the state then counted one node too few under a build's load,
    closing a grow's round without the joiner. None when the state cannot be read."""
    if watch is None:
        return None
    try:
        got = watch.read_state()
        state = pickle.loads(got[0]) if got else None
    except Exception:
        return None
    if state is None:
        return None
    now, bound = datetime.now(UTC), watch.watch.bound
    alive = {
        str(node) for node, beat in state.last_heartbeats.items() if (now - beat).total_seconds() < bound
    }
    healers: set[str] = set()
    if round_ is not None:  # read after the state: a healer gone from it named itself before it left
        key = healers_key(watch.run_id, round_)
        with contextlib.suppress(Exception):
            done, named = watch.reading.ask(lambda: watch.store.get(key) if watch.store.check([key]) else b"")
            healers = set(bytes(named).decode().split(";")) - {""} if done else set()
    waiting = {str(node) for node in state.wait_list} & alive
    return Meeting(len(alive | healers), bool(waiting - healers))


def joining(handler: Any) -> int:
    """How many nodes train in the world this node would join (torch's stored state: a round complete,
    this node none of its members, room for it); 0 where none does, or the state cannot be read. Before
    its first rendezvous, such a node is a grow's joiner: the world pauses for it from the moment it waits
    in the rendezvous (:func:`ddp_trainer.launch.warm.before_joining`), and it polls as a heal does
    (:func:`polling`: measured, a joiner's 1 s poll was 0.9 s of a healed grow's 1.7 s pause)."""
    try:
        got = handler._state_holder._backend.get_state()
        state = pickle.loads(got[0]) if got else None
    except Exception:  # the rendezvous says the store's trouble
        return 0
    if state is None or not state.complete or state.closed or handler._this_node in state.participants:
        return 0
    members = len(state.participants)
    return members if members < handler._settings.max_nodes else 0


@contextlib.contextmanager
def closing_at(handler: Any, meeting: Meeting | None, last_call: float | None = None) -> Iterator[None]:
    """torch's rendezvous ``handler`` closing its next round as soon as the ``meeting``'s nodes joined (its
    ``max_nodes`` for that round: the survivors of a loss know how many they are), put back after. Fewer
    join: the last call closes the round; more: the first ones make it, the others wait for the next (a
    grow). Outside ``[min_nodes, max_nodes]``, or another handler, nothing changes.

    Where fewer than ``max_nodes`` meet, or a node joins, the last call is ``last_call`` seconds, not
    torch's 2 s: each of a node's writes of torch's state is a compare-and-set, and every member of a round
    not closed yet rewrites its keep-alive each second, so on a loaded machine the node that joins last
    can lose that race for seconds (measured: a grow's joiner lost it four times in 1.6 s, the 2 s last
    call closed the round without it, and it joined the next: a heal more). The heal asks twice the
    keep-alive bound: a node that wrote nothing for the bound is dropped by torch, and adds itself again
    at its next write that succeeds. Not for a round of ``max_nodes`` that no node joins (a loss whose node
    the store had not dropped yet when counted): it waits for no one longer than before."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        RendezvousTimeout,
    )

    settings = getattr(handler, "_settings", None)
    if (
        not isinstance(handler, DynamicRendezvousHandler)
        or settings is None
        or meeting is None
        or not settings.min_nodes <= meeting.nodes <= settings.max_nodes
    ):
        yield
        return
    timeout = settings.timeout
    longer = last_call or 0.0
    if longer > timeout.last_call.total_seconds() and (meeting.joining or meeting.nodes < settings.max_nodes):
        timeout = RendezvousTimeout(timeout.join, timedelta(seconds=longer), timeout.close, timeout.heartbeat)
    elif meeting.nodes == settings.max_nodes:
        yield
        return
    executor: Any = handler._op_executor  # torch's _DistributedRendezvousOpExecutor reads its own copy
    changed = dataclasses.replace(settings, max_nodes=meeting.nodes, timeout=timeout)
    handler._settings = executor._settings = changed
    try:
        with closing_when_full():
            yield
    finally:
        handler._settings = executor._settings = settings


@contextlib.contextmanager
def closing_when_full() -> Iterator[None]:
    """torch's join op closing a round its node already joined once the participants reach that node's
    ``max_nodes``, put back after. torch closes a round at ``max_nodes`` only as a node adds itself, by that
    node's own settings: a healer that counted a dead node still alive (the store had not dropped it yet)
    keeps torch's ``max_nodes`` and joins second, and the healer that counted right, first in, waited its
    whole last call (seen: 12 s for a round of 2 both had joined)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    op = rdzv._RendezvousJoinOp
    original = op.__call__

    def join(self: Any, ctx: Any, deadline: float) -> Any:
        state = ctx.state
        if (
            not state.closed
            and not state.complete
            and ctx.node in state.participants
            and len(state.participants) >= ctx.settings.max_nodes
            and time.monotonic() <= deadline
        ):
            return rdzv._Action.MARK_RENDEZVOUS_COMPLETE
        return original(self, ctx, deadline)

    op.__call__ = join  # type: ignore[method-assign]
    try:
        yield
    finally:
        op.__call__ = original  # type: ignore[method-assign]


POLL_SECONDS = 0.1
"""How often a heal's rendezvous reads torch's state while it waits (torch's own poll: every second)."""


@contextlib.contextmanager
def polling(handler: Any = None, every: float = POLL_SECONDS) -> Iterator[None]:
    """torch's rendezvous polling its state every ``every`` seconds instead of every second while it waits,
    put back after: its op executor's ``SYNC`` delay, and ``handler``'s state holder serving its cached
    state for as long (``_cache_duration``, 1 s: a read within a second of the last one returns the last
    one). A heal's round is a few agents that know they meet, and after a loss each second of torch's poll
    is a second every survivor's training stands still (measured: a survivor that joined before the round
    closed slept 0.9 s of a 1.9 s heal; with the delay alone, a survivor in the wait list while the other
    left the old round read its cached state for 1.0 s of a 2.0 s heal). Its other delays (the
    compare-and-set back-off) stay."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    original = rdzv._delay  # type: ignore[attr-defined]
    holder = getattr(handler, "_state_holder", None)
    cached = getattr(holder, "_cache_duration", None)

    def delay(seconds: float | tuple[float, float]) -> None:
        original(seconds=every if seconds == 1 else seconds)

    rdzv._delay = delay  # type: ignore[attr-defined]
    if cached is not None:
        holder._cache_duration = min(cached, every)  # type: ignore[union-attr]
    try:
        yield
    finally:
        rdzv._delay = original  # type: ignore[attr-defined]
        if cached is not None:
            holder._cache_duration = cached  # type: ignore[union-attr]
