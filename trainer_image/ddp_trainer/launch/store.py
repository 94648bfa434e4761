"""``python -m ddp_trainer.launch.store PORT``: the ``c10d`` rendezvous store of an elastic job, in a
process of its own.

torchrun's ``c10d`` rendezvous keeps its state in a TCPStore that one agent hosts: the node whose address
is the endpoint. Lose that node and the rendezvous is gone with it, and every node restarts (the failure
of PyTorchJob's elastic mode, whose store lived on worker 0). Here no worker hosts it: this process does,
and every agent connects to it (``DDPJOB_RDZV_STORE=external`` makes the launcher say ``is_host=0``), so
any node may leave, node 0 included, and the others re-rendezvous at once. It holds only the rendezvous'
few keys; the workers' own store is made afresh by the agent of each round's rank 0.

It also watches each agent's process (:func:`announce`, :func:`watch_presence`): every launcher holds a
connection to it for its life, and when that connection closes (the process ended: a crash, SIGKILL, an
OOM kill, its container killed) the store marks that agent's rendezvous heartbeat as expired at once, so
the survivors re-form the world in about a second instead of after the keep-alive bound
(:data:`contract.ELASTIC_RDZV_CONF`). A node that vanishes without closing its connection (power lost, the
network cut) is still let go by the keep-alive bound, as torch does it.

Long because both ends of the presence line live here: the store's side (:func:`serve`,
:func:`watch_presence`, :func:`drop`) and the agents' (:func:`announce`, :func:`wait_for`, :func:`gather`)
speak one small wire protocol, and a change to one end must be read beside the other.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from ddp_trainer import contract

log = logging.getLogger("ddp_trainer.launch.store")

WAIT_SECONDS = 600.0
"""How long an agent waits for the store to answer before it gives up (the store pod's image may be pulled
on a node that has never run the job)."""
WAIT_SAY_EVERY = 10.0


def serve(port: int, host: str = "0.0.0.0") -> int:
    """Host the store on ``host:port`` until SIGTERM or SIGINT; the signal's number. In a cluster that is
    when the operator deletes its Job: with the attempt's Job, or when the DDPJob finished. Until then a pod
    that starts late finds the rendezvous closed and ends at once (the launcher's exit 0)."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    stop, got = threading.Event(), [int(signal.SIGTERM)]

    def stopped(number: int, _: object) -> None:
        got[0] = number
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stopped)
    store = TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    watched = watch_presence(store, host)
    print(
        f"ddpjob rendezvous store: serving on {host}:{port}; every node connects here, none hosts it; "
        f"agents' processes watched on :{watched}",
        flush=True,
    )
    stop.wait()
    del store
    return got[0]


PRESENCE_KEY = "ddpjob/presence-port"
"""The store key that holds the port on which the store process watches the agents' processes."""
LONG_AGO = datetime(1970, 1, 1, tzinfo=UTC)
_held: list[socket.socket] = []  # this process's announcement, open until the process ends


def _say(line: str) -> None:
    print(line, flush=True)


def _say_on_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def watch_presence(store: Any, host: str = "0.0.0.0", say: Callable[[str], None] = _say) -> int:
    """Listen for the agents' announcements (:func:`announce`) on a free port, publish it under
    :data:`PRESENCE_KEY`, and, when an announced connection closes, drop that agent from the rendezvous
    (:func:`drop`). Returns the port."""
    listener = socket.create_server((host, 0))
    port = int(listener.getsockname()[1])
    lock = threading.Lock()  # one TCPStore client, shared by the watchers
    latest: dict[tuple[str, str, int], socket.socket] = {}

    def watch(conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(10)
                hello = json.loads(conn.makefile("rb").readline(4096))
                agent = (str(hello["run_id"]), str(hello["addr"]), int(hello["pid"]))
                with lock:
                    latest[agent] = conn
                conn.sendall(b"watched\n")
                conn.settimeout(None)
                while conn.recv(64):
                    pass
            except (OSError, ValueError, KeyError, TypeError):
                return  # not an announcement (a port probe, say): nothing to drop
            with lock:
                # A pod's replacement has the same address and often the same pid (1): once it announced
                # itself, the end of the old connection (late, when a lost node's network came back) is not
                # its end.
                if latest.get(agent) is not conn:
                    return
                del latest[agent]
                dropped = drop(store, *agent)
        if dropped:
            say(
                f"ddpjob rendezvous store: the agent {agent[1]} (pid {agent[2]}) ended; dropped "
                f"{', '.join(dropped)} from rendezvous {agent[0]} now, not after the keep-alive bound"
            )

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=watch, args=(conn,), name="ddpjob-presence", daemon=True).start()

    threading.Thread(target=accept, name="ddpjob-presence-accept", daemon=True).start()
    store.set(PRESENCE_KEY, str(port))
    return port


def drop(store: Any, run_id: str, addr: str, pid: int, attempts: int = 50) -> list[str]:
    """Mark the rendezvous heartbeats of the agent ``addr``/``pid`` as expired in torch's ``c10d``
    rendezvous state of ``run_id``, under the state's compare-and-set token; the names of the nodes marked.

    Only the heartbeat changes: each agent's next read of the state removes the node with torch's own
    sanitizer (participants, wait list, the round's end), exactly as when the keep-alive bound passes.
    The state is torch's ``_RendezvousState`` (``torch.distributed.elastic.rendezvous.dynamic_rendezvous``,
    its fields the same since torch 1.10); a state this cannot read leaves the keep-alive bound to act."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    backend = C10dRendezvousBackend(store, run_id)
    for _ in range(attempts):
        got = backend.get_state()
        if got is None:
            return []
        try:
            state = pickle.loads(got[0])
            gone = [node for node in state.last_heartbeats if node.addr == addr and node.pid == pid]
        except (pickle.PickleError, AttributeError, TypeError) as exc:
            log.warning(
                "the rendezvous state of %s could not be read (%s); the keep-alive bound acts", run_id, exc
            )
            return []
        if not gone or state.closed:  # gone already, or the job's rendezvous ended (the agents' last exit)
            return []
        for node in gone:
            state.last_heartbeats[node] = LONG_AGO
        written = backend.set_state(pickle.dumps(state), got[1])
        if written is None or written[2]:
            return [repr(node) for node in gone]
    return []


def announce(
    host: str,
    port: int,
    run_id: str,
    addr: str,
    say: Callable[[str], None] = _say_on_stderr,
) -> bool:
    """Tell the store's process watch that this agent (``addr``, this pid: torch's node descriptor) lives,
    and hold the connection open until this process ends. False, said, if the watch cannot be reached (a
    NetworkPolicy that allows only the store's port, say): a lost node is then let go by the keep-alive
    bound."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    try:
        client = TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=10))
        watch_port = int(client.get(PRESENCE_KEY))
        conn = socket.create_connection((host, watch_port), timeout=5)
        conn.sendall(json.dumps({"run_id": run_id, "addr": addr, "pid": os.getpid()}).encode() + b"\n")
        with conn.makefile("rb") as reply:  # the acknowledgement, however the bytes arrive
            acknowledged = reply.readline(16) == b"watched\n"
        if not acknowledged:
            raise ValueError("the watch did not acknowledge")
        conn.settimeout(None)
    except (OSError, RuntimeError, ValueError) as exc:
        say(
            f"ddpjob: the rendezvous store's process watch at {host} cannot be reached ({exc}); a lost node "
            "is let go after the keep-alive bound instead"
        )
        return False
    _held.append(conn)
    return True


def endpoint(env: Mapping[str, str]) -> tuple[str, int] | None:
    """The external store's host and port, when this pod's agent connects to one (an elastic job's)."""
    if env.get(contract.RDZV_STORE_ENV) != contract.RDZV_STORE_EXTERNAL:
        return None
    host, _, port = env.get(contract.PET_RDZV_ENDPOINT, "").rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


class _Every:
    """True at most once every :data:`WAIT_SAY_EVERY` seconds: when a wait says again what it waits for
    (not a line a poll)."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def due(self) -> bool:
        if time.monotonic() - self.last < WAIT_SAY_EVERY:
            return False
        self.last = time.monotonic()
        return True


def wait_for(
    host: str,
    port: int,
    timeout: float = WAIT_SECONDS,
    say: Callable[[str], None] = _say_on_stderr,
) -> bool:
    """Wait until the store at ``host:port`` accepts a connection (its pod may be scheduled, pulled and
    started after this one), saying what it waits for every :data:`WAIT_SAY_EVERY` seconds; False if it
    never did within ``timeout``."""
    started, every = time.monotonic(), _Every()
    while True:
        try:
            with socket.create_connection((host, port), timeout=2):
                if (waited := time.monotonic() - started) >= WAIT_SAY_EVERY:
                    say(f"ddpjob: the rendezvous store at {host}:{port} answers after {waited:.0f} s")
                return True
        except OSError as exc:
            waited = time.monotonic() - started
            if waited >= timeout:
                say(
                    f"ddpjob: the rendezvous store at {host}:{port} did not answer in {timeout:.0f} s "
                    f"({exc}); its pod is <job>-<attempt>-rdzv: kubectl describe pod says why it does not run"
                )
                return False
            if every.due():
                say(
                    f"ddpjob: waiting for the rendezvous store at {host}:{port} ({exc}): {waited:.0f} s "
                    f"of {timeout:.0f} s"
                )
            time.sleep(0.5)


GATHER_SECONDS = 60.0
"""How long a node waits at the store for the job's other nodes before the first rendezvous; then the
agents meet with those there (at least ``minNodes``, else torch's rendezvous waits on)."""
ARRIVED_KEY = "ddpjob/arrived"


def gather(
    host: str,
    port: int,
    nodes: int,
    timeout: float = GATHER_SECONDS,
    say: Callable[[str], None] = _say_on_stderr,
) -> int:
    """Count this node in at the store and wait until ``nodes`` have come (or ``timeout``), saying what
    it waits for every :data:`WAIT_SAY_EVERY` seconds; returns how many came.

    The rendezvous closes a round ``last_call_timeout`` after the minimum joined: pods that start a few
    seconds apart (image pulls, a loaded node) would split the first round into a small world and a grow
    at once. Gathered here first, every agent starts its first round within a moment of the others, so the
    last call can be short, and a lost node is let go in seconds. A node that comes later (a replacement, a
    scale-up) finds the count reached and goes on at once."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    client = TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=30))
    came = int(client.add(ARRIVED_KEY, 1))
    started, every = time.monotonic(), _Every()
    while came < nodes:
        waited = time.monotonic() - started
        if waited >= timeout:
            say(
                f"ddpjob: {came} of {nodes} nodes came to the rendezvous store in {timeout:.0f} s; the first "
                "rendezvous starts with them and the others join when they come"
            )
            break
        if every.due():
            say(
                f"ddpjob: waiting for {nodes - came} more of {nodes} nodes before the first rendezvous: "
                f"{waited:.0f} s of {timeout:.0f} s"
            )
        time.sleep(0.1)
        came = int(client.add(ARRIVED_KEY, 0))
    return came


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python -m ddp_trainer.launch.store PORT", file=sys.stderr)
        return 2
    # 128 + the signal, as a shell says it: a store pod stopped on its own (deleted, evicted, its node
    # drained) is a failed pod, which its Job replaces (backoffLimit); an exit 0 would complete the Job,
    # and no store would serve the running world again. The operator's own stop deletes the Job anyway.
    return 128 + serve(int(argv[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
