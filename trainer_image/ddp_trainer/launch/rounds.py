"""An agent's view of its rendezvous round, the torch side of :mod:`ddp_trainer.launch.silence`:
torch's ``c10d`` rendezvous state read as stored, the mark every agent of a round follows, and the stop of
workers that wait in a collective with a silent peer (or are stale). The launcher (:mod:`.agent`) calls it
from its wrapped ``_monitor_workers`` and ``_rendezvous``; ``tests/contract/test_torch_private.py`` checks
each private part of torch read here.

Long because every read of the store that an agent's loop makes lives here, each bounded the same way:
torch's store client waits on past its own timeout when the store's host goes silent, so the watch's reads
(:meth:`RoundWatch.read_state`) and torch's ``num_nodes_waiting`` (:func:`bounded_waiting`) run in threads
given up after the read timeout, and the agent comes back to judge."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from ddp_trainer import contract
from ddp_trainer.launch import silence


class RoundWatch:
    """The torch side of :class:`silence.Watch` for one agent (an elastic job's, or a rigid job's under the
    launcher): it reads torch's ``c10d`` rendezvous state as stored (``_RendezvousState``: ``round``,
    ``participants``, ``last_heartbeats``, ``closed``) through the handler's private ``_store``, ``_settings``
    and ``_this_node``, and sets and reads the mark that makes every agent of the round follow the first that
    judged.

    It also keeps the last state it read of its round (:attr:`view`): a store that comes back empty (its
    process or pod lost and a new one started) is given that round back (:meth:`restore`), so that the
    nodes that train on re-form with the new store at the next resize instead of meeting in a round 0 that
    knows none of them."""

    def __init__(self, handler: Any, hosted_by_a_node: bool = False, presence: bool = False) -> None:
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

        settings = handler._settings
        self.handler, self.run_id, self.store = handler, str(settings.run_id), handler._store
        bound = settings.keep_alive_interval * settings.keep_alive_max_attempt
        self.watch = silence.Watch(
            bound=bound.total_seconds(), interval=settings.keep_alive_interval.total_seconds()
        )
        self.backend = C10dRendezvousBackend(self.store, self.run_id)
        self.failed_reads = 0
        self.hosted_by_a_node = hosted_by_a_node
        """The store lives in node 0's agent (a rigid job's, seen from another node): a store that does not
        answer is node 0 gone silent."""
        self.presence = presence
        """The store is an elastic job's own process, which watches every agent's process
        (:func:`store.announce`): after a reconnect this agent announces itself again, to a new store's
        watch."""
        self.reconnects = 0
        """How many times :meth:`reconnect` renewed the client: the agent then takes the handler's store
        again (:func:`agent._install`), for its exit barrier at the end."""
        self.view: bytes | None = None
        """The last ``_RendezvousState`` of this agent's round it read (pickled as stored), for
        :meth:`restore`."""
        timeout = getattr(self.store, "timeout", None)
        self.reading = InFlight(timeout.total_seconds() if isinstance(timeout, timedelta) else READ_SECONDS)
        """The reads of the state (:meth:`read_state`), each given up after the store client's own timeout
        (the rendezvous' ``read_timeout``)."""
        self.grace = RESTORE_GRACE_READS * self.reading.seconds
        """How far ahead of now a restored round's keep-alives are set (:meth:`restore`)."""
        self.said_where = False
        """Whether this agent wrote where it runs (:func:`where_key`)."""
        self.where: dict[str, str] = {}
        """The Kubernetes node each member of the round said it runs on, by address, read while the store
        answers (a silent member, or a store host gone silent, cannot be asked then)."""

    def begin(self) -> None:
        """The agent's rendezvous returned: the round it joined, as the handler saw it. The first time,
        this node says where it runs (:func:`where_key`), so that another agent that judges it silent
        names its Kubernetes node too."""
        if not self.said_where:
            self.said_where = True
            with contextlib.suppress(Exception):  # naming is a courtesy: a store that cannot take it is said
                node = os.environ.get(contract.NODE_NAME_ENV, "").strip()  # by the watch's reads anyway
                if node:
                    self.store.set(where_key(self.run_id, self.handler._this_node.addr), node)
        state = self.handler._state_holder.state
        self.watch.begin(
            state.round, self.handler._this_node, state.participants, state.last_heartbeats, time.monotonic()
        )
        self.view = pickle.dumps(state) if self.handler._this_node in state.participants else None

    def restore(self) -> None:
        """The store answers but holds no rendezvous state: a new store, the old one lost with its process
        or pod. Write this node's last view of its round back (:func:`refreshed`), under torch's
        compare-and-set against the empty value, so the first node to find it empty restores it and the
        others find it there; with it, the gather count a node that comes later waits for
        (:data:`store.ARRIVED_KEY`)."""
        from ddp_trainer.launch.store import ARRIVED_KEY

        if self.view is None:
            return
        state = refreshed(pickle.loads(self.view), datetime.now(UTC) + timedelta(seconds=self.grace))
        written = self.backend.set_state(pickle.dumps(state))  # no token: compare-and-set against empty
        if written is None or not written[2]:
            return  # another node restored it first (or wrote a round since): read at the next poll
        self.store.add(ARRIVED_KEY, len(state.participants))
        print(
            f"[launcher] the rendezvous store came back empty: restored round {state.round} with "
            f"{len(state.participants)} node(s) from this node's last view, each node's keep-alive held "
            f"{self.grace:.0f} s for it to reach the new store",
            file=sys.stderr,
            flush=True,
        )

    def reconnect(self) -> None:
        """A new client of the same store, for this watch and for torch's handler alike: a client whose
        request timed out on a network that went away (this pod's network cut, the store's pod lost) may
        never answer right again, and the agent's next rendezvous goes through the handler's client."""
        from torch.distributed import TCPStore  # type: ignore[attr-defined]
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

        old = self.store
        # a plain connection first: torch's client retries its connection with a growing back-off for up to
        # its timeout, and missed a store that came up meanwhile by seconds (this node then reached the new
        # store long after the others, who judged it silent); a store that does not answer yet fails here
        # at once, and the next poll tries again
        with socket.create_connection((old.host, old.port), timeout=PROBE_SECONDS):
            pass
        fresh = TCPStore(old.host, old.port, is_master=False, wait_for_workers=False, timeout=old.timeout)
        self.store, self.backend = fresh, C10dRendezvousBackend(fresh, self.run_id)
        self.handler._store, self.handler._state_holder._backend = fresh, self.backend
        self.reading = InFlight(self.reading.seconds)  # a read stuck on the old client is not waited for
        self.reconnects += 1
        print(
            f"[launcher] reconnected to the rendezvous store at {old.host}:{old.port}",
            file=sys.stderr,
            flush=True,
        )

    def announce(self) -> None:
        """Announce this agent to the store's process watch again (a new store's watch knows none of the
        agents that announced themselves to the old one); said by :func:`store.announce` if it cannot."""
        from ddp_trainer.launch import store

        store.announce(self.store.host, self.store.port, self.run_id, self.handler._this_node.addr)

    def name(self, node: Any) -> str:
        """:func:`node_name` with the Kubernetes node it said it runs on, if it did."""
        return node_name(node, self.where.get(str(getattr(node, "addr", ""))))

    def learn_where(self, members: Any) -> None:
        """Reads where each member of the round runs, for those not known yet (one store check each, only
        until every member said it)."""
        for node in members:
            addr = str(getattr(node, "addr", ""))
            if addr and addr not in self.where:
                with contextlib.suppress(Exception):
                    key = where_key(self.run_id, addr)
                    if self.store.check([key]):
                        self.where[addr] = self.store.get(key).decode()

    def host_where(self, host: str) -> str:
        """``, on node X`` for the store's host (a pod's host name, perhaps not fully qualified), if a
        member at that address said where it runs."""
        first = host.split(".")[0]
        for addr, where in self.where.items():
            if addr.split(".")[0] == first:
                return f", on node {where}"
        return ""

    def read_state(self) -> Any:
        """The backend's ``get_state``, given up after the store's read timeout. The read runs in a thread
        of its own: a request to a store whose host is frozen or cut off can outlast the client's own
        timeout (torch's client waits on, after saying ``timed out after 15000ms``), and this agent must
        then still judge (a rigid job's node 0 gone silent). A read still stuck is waited for again, not
        repeated."""
        done, got = self.reading.ask(self.backend.get_state)
        if not done:
            raise TimeoutError(f"reading the rendezvous state timed out after {self.reading.seconds:.0f} s")
        return got

    def poll(self, force: bool = False, starting: Callable[[], bool] = bool) -> silence.Verdict | None:
        """What the stored state says now, every :data:`silence.POLL_SECONDS` (``force``: now); None when the
        store cannot be read (the keep-alive thread and the next rendezvous say that store's trouble).
        ``starting()``: whether this agent's workers have not said yet that their group formed."""
        if not force and not self.watch.due(time.monotonic()):
            return None
        try:
            if reconnected := bool(self.failed_reads):
                self.reconnect()
            got = self.read_state()
            if got is None:  # answers, and holds no state: a new store
                self.restore()
                got = self.read_state()
            if reconnected and self.presence:
                self.announce()
            state = pickle.loads(got[0]) if got else None
            if got is None or state is None or state.closed:
                self.failed_reads = 0
                return None
            if state.round == self.watch.round_number and self.handler._this_node in state.participants:
                self.view = got[0]
                self.learn_where(state.participants)
            self.watch.excuse(held(state.last_heartbeats, datetime.now(UTC)), time.monotonic())
            key = silence.mark_key(self.run_id, self.watch.round_number)
            mark = self.store.get(key).decode() if self.store.check([key]) else None
            verdict = self.watch.observe(
                state.round,
                state.participants,
                state.last_heartbeats,
                mark,
                time.monotonic(),
                self.name,
                starting=bool(starting()),
            )
            if verdict is not None and verdict.kind == silence.SILENT and verdict.judged_here:
                self.store.set(key, verdict.names())
        except Exception as exc:  # a store that cannot be read must not end a healthy agent
            if signalled(exc):  # this pod is stopped: never taken for the store's trouble
                raise
            if self.hosted_by_a_node and _timed_out(exc):
                host = getattr(self.store, "host", "node 0")
                said = f"{host} (node 0, which hosts the rendezvous{self.host_where(str(host))})"
                return silence.Verdict(silence.SILENT, (said,), self.reading.seconds)
            self.failed_reads += 1
            if self.failed_reads in (1, 10, 100):
                print(
                    f"[launcher] the rendezvous store does not answer: its state could not be read ({exc}); "
                    f"{self.failed_reads} failed read(s) in a row",
                    file=sys.stderr,
                    flush=True,
                )
            return None
        self.failed_reads = 0
        return verdict


def refreshed(state: Any, until: datetime) -> Any:
    """``state`` (a ``_RendezvousState``) with every keep-alive in it set to ``until``, ahead of now by
    :data:`RESTORE_GRACE_READS` read timeouts: the store's outage is nobody's silence, and the nodes reach the
    new store one by one (a call through the old client may wait out the read timeout first, and a
    connection attempt its own), so none is dropped, by torch's sanitizer or by another agent's watch
    (:meth:`silence.Watch.excuse`), before it had that time. torch's keep-alive renews a node's only once
    it is past; one lost meanwhile is dropped the keep-alive bound after ``until``."""
    for node in list(state.last_heartbeats):
        state.last_heartbeats[node] = until
    return state


RESTORE_GRACE_READS = 2
"""A restored round's keep-alives are held this many read timeouts ahead (2 × 15 s for an elastic job):
one for a call stuck on the old client, one for the reconnect. Measured locally before this hold: a node
reached the new store 6 to 10 s after the first had restored the round, and was judged silent by it."""
PROBE_SECONDS = 2.0
"""How long a reconnect's plain connection to the store may take before this poll gives up (the next tries
again)."""


def held(beats: Any, now: datetime) -> list[Any]:
    """The nodes whose keep-alive in ``beats`` is ahead of ``now``: a restored round's hold
    (:func:`refreshed`), during which no node is judged silent."""
    return [node for node, beat in beats.items() if isinstance(beat, datetime) and beat > now]


def signalled(exc: BaseException) -> bool:
    """``exc`` is torch's ``SignalException``: the launcher's SIGTERM or SIGINT (its pod stopped), which
    torch's handler raises wherever the agent's main thread is, a read of the store included. Caught there
    as the store's trouble, it was lost: the launcher trained on past its pod's grace period."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    return isinstance(exc, SignalException)


def _timed_out(exc: Exception) -> bool:
    """A store read that timed out (torch's ``DistStoreError``, or the rendezvous backend's wrapper of it)."""
    text = f"{type(exc).__name__}: {exc} {exc.__cause__ or ''}".lower()
    return "timeout" in text or "timed out" in text


class InFlight:
    """A call run in a daemon thread of its own and given up after ``seconds``: a store request to a
    silent host can outlast the client's own timeout. A call still running when asked again is waited
    for (what is left of its ``seconds``), not repeated."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.running: tuple[threading.Thread, dict[str, Any], float] | None = None

    def ask(self, call: Any) -> tuple[bool, Any]:
        """(True, its result) once the call returned (its error raised here); (False, None) while not."""
        if self.running is None:
            box: dict[str, Any] = {}

            def run() -> None:
                try:
                    box["got"] = call()
                except Exception as exc:  # raised in the caller's thread below
                    box["error"] = exc

            thread = threading.Thread(target=run, name="ddpjob-in-flight", daemon=True)
            thread.start()
            self.running = (thread, box, time.monotonic())
        thread, box, started = self.running
        thread.join(max(0.0, self.seconds - (time.monotonic() - started)))
        if thread.is_alive():
            return False, None
        self.running = None
        if "error" in box:
            raise box["error"]
        return True, box.get("got")


READ_SECONDS = 15.0
"""A read's limit where the store does not say its own timeout (the rendezvous' ``read_timeout``)."""


def where_key(run_id: str, addr: str) -> str:
    """The store key under which the agent at ``addr`` wrote the Kubernetes node it runs on."""
    return f"ddpjob/where/{run_id}/{addr}"


def node_name(node: Any, where: str | None = None) -> str:
    """A rendezvous node as people read it: its address (a pod's host name), its agent's pid and, where
    it said so, the Kubernetes node it runs on."""
    on = f", on node {where}" if where else ""
    return f"{getattr(node, 'addr', node)} (pid {getattr(node, 'pid', '?')}{on})"


STOP_WAIT_SECONDS = 10.0


def stop_now(agent: Any, group: Any, monitor: Any) -> Any:
    """SIGKILL every worker of ``group`` (they wait in a collective that cannot end, or are stale) and
    return the agent's first view of them ended."""
    from torch.distributed.elastic.agent.server.api import WorkerState

    for worker in group.workers:
        with contextlib.suppress(ProcessLookupError, TypeError, ValueError):
            os.kill(int(worker.id), signal.SIGKILL)
    deadline = time.monotonic() + STOP_WAIT_SECONDS
    while True:
        result = monitor(agent, group)
        if result.state != WorkerState.HEALTHY or time.monotonic() > deadline:
            return result
        time.sleep(0.05)


def bounded_waiting(num_nodes_waiting: Any, seconds: float = READ_SECONDS) -> Any:
    """torch's ``num_nodes_waiting`` for a rigid agent, which the agent asks after each look at healthy
    workers, given up after the read timeout: it reads the store through the handler's client, which waits
    on without end when the store's host (node 0) went silent, and the agent must come back to its watch,
    which then judges node 0 silent. 0 while a call is still in flight; a call's error is raised, as
    torch's would be."""
    flight = InFlight(seconds)

    def wrapped(self: Any) -> int:
        done, got = flight.ask(lambda: num_nodes_waiting(self))
        return int(got) if done else 0

    return wrapped


def patient(num_nodes_waiting: Any) -> Any:
    """torch's ``num_nodes_waiting``, which the agent asks after each look at healthy workers, for an elastic
    agent whose rendezvous store cannot be read for a while (its own network cut, the store's pod lost):
    none waiting, said once, so the workers train on instead of the agent ending with the store's error.
    The world cannot change until the store answers again, which is said too."""
    since: list[float] = []

    def wrapped(self: Any) -> int:
        try:
            waiting = int(num_nodes_waiting(self))
        except Exception as exc:  # the store's errors: a connection refused, a read timed out
            if signalled(exc):
                raise
            if not since:
                since.append(time.monotonic())
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                print(
                    f"[launcher] the rendezvous store does not answer ({first}; {exc.__cause__ or ''}): this "
                    "node's workers train on, and the world cannot change until it answers again",
                    file=sys.stderr,
                    flush=True,
                )
            return 0
        if since:
            print(
                f"[launcher] the rendezvous store answers again after {time.monotonic() - since.pop():.0f} s",
                file=sys.stderr,
                flush=True,
            )
        return waiting

    return wrapped
