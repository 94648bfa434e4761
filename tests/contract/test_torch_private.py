"""torch's private parts that ddpjob reads or wraps, checked for what is read of them, not only that the
name exists: a torch that renames or reshapes one fails here, naming it, before an elastic job fails in
production. Each check builds the real object where one process can (a real TCPStore on 127.0.0.1, the
rendezvous handler torch's own registry builds from the launcher's settings, a real agent and process
context that start nothing) and reads it the way the product does. The torch these ran on is pinned in
``pyproject.toml`` (``tests/contract/test_torch_pin.py``; docs/operator.md, "Moving the torch pin").

Each private name, who reads it, and what is checked of it:

- ``dynamic_rendezvous._RendezvousState`` (launch/rounds.py, launch/store.py): ``round``, ``closed``,
  ``participants``, ``last_heartbeats`` by type, after a pickle round trip; and that torch's own sanitizer
  drops a node whose heartbeat :func:`ddp_trainer.launch.store.drop` set to long ago (its UTC datetime
  compared with torch's).
- ``dynamic_rendezvous._NodeDesc`` (rounds.py, store.py, silence.py): ``addr`` and ``pid``, hashed by value,
  named by ``repr``; this agent's is ``(getfqdn(), getpid())``, what ``store.announce`` says.
- ``DynamicRendezvousHandler._settings`` (rounds.py): ``run_id``, the keep-alive bound (interval × max
  attempts) as a timedelta, set from the launcher's ``PET_RDZV_CONF``.
- ``DynamicRendezvousHandler._store`` (rounds.py): a TCPStore with ``host``, ``port``, ``timeout`` (the
  ``read_timeout`` of the launcher's conf, which ``c10d_rendezvous_backend._create_tcp_store`` reads),
  replaced on reconnect.
- ``DynamicRendezvousHandler._this_node`` (rounds.py): a ``_NodeDesc``.
- ``C10dRendezvousBackend`` (rounds.py ``RoundWatch.restore``, store.py): made on a new, empty store it
  marks the state empty (``get_state`` None), and ``set_state(state)`` with no token is a compare-and-set
  against that mark: the first node's restore is written, a second finds it (``has_set`` False); torch's
  state holder then reads the restored round, and its sanitizer keeps the nodes whose keep-alives were
  refreshed.
- ``DynamicRendezvousHandler._state_holder`` and its ``.state`` and ``._backend`` (rounds.py): the state
  read at a round's start; the backend replaced on reconnect, and torch's holder writes through the new one.
- ``DynamicRendezvousHandler.num_nodes_waiting`` (public, wrapped by ``rounds.patient``): ``(self)``, an
  int, asked by ``_invoke_run`` between looks at healthy workers, not overridden by the handler c10d builds.
- ``LocalElasticAgent._monitor_workers`` and ``SimpleElasticAgent._rendezvous`` (agent.py, wrapped):
  ``(self, worker_group)``, called by torch positionally, defined where the launcher patches them; what
  ``_rendezvous`` sets on the worker group (``group_world_size``) and reads of it (``spec.rdzv_handler``).
- ``SimpleElasticAgent._remaining_restarts`` (agent.py): an int on a real agent, spent by ``_invoke_run``.
- ``DynamicRendezvousHandler._get_store()`` and ``SimpleElasticAgent._store`` (agent.py): after a
  reconnect, the agent's store (its exit barrier's) is the handler's renewed client, wrapped again.
- ``SimpleElasticAgent._assign_worker_ranks`` (agent.py): its wait times out with ``DistStoreError``.
- ``LocalElasticAgent._pcontext``, ``MultiprocessContext._pc`` (its ``.processes``) and ``error_files``
  (agent.py ``_ended``, read through getattr with defaults, so a rename is silent but here).
- ``torch.distributed.run.config_from_args`` (warm.py ``warm_config_from_args``, replaced on the module):
  ``(args)``, ``(config, entrypoint, args)``, looked up by ``run`` on the module; ``parse_args``'s fields
  read.
- ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE`` (agent.py ``main``): torch's switch still read.
- ``torch._dynamo`` (warm.py ``warm_failure_path`` imports it ahead): still a module.
- ``torch._foreach_zero_``, ``torch._foreach_copy_`` (sync/fingerprints/torch_kernel.py): their effect.
- ``torch.cuda.jiterator._create_jit_fn`` (torch_kernel.py, CUDA only, with a fallback): ``(code_string)``.
- ``OptimizedModule._orig_mod`` (core/wrappers.py, matched by class name): the class and the attribute,
  read from torch's source without importing ``torch._dynamo`` (a real compile:
  tests/integration/trainer/test_health.py).
- A heal's rendezvous without a restart (launch/heal_round.py): ``SimpleElasticAgent._rendezvous`` replaces
  ``worker_group.workers`` with new ``Worker`` objects (``id`` None; ``local_rank``, ``global_rank``,
  ``world_size`` set by ``_assign_worker_ranks``) and sets ``group_rank``, ``group_world_size``,
  ``master_addr``, ``master_port``; ``LocalElasticAgent._monitor_workers`` says UNKNOWN when the workers' ids
  differ from its process context's pids (so the heal puts the ids back); ``SimpleElasticAgent.
  _restart_workers(self, worker_group)`` (wrapped where heals are armed: ``heal.restart_or_heal``) is what
  ``_invoke_run`` calls, positionally, both for failed workers and, the group's state still healthy, for a
  node waiting to join. Read from their source.
- ``rendezvous._create_c10d_store`` (core/reform.py ``bootstrap_store`` mirrors it, never calls it: a healed
  survivor and a worker started fresh by ``env://`` must meet on one store): without the agent's store, rank
  0 hosts a multi-tenant libuv TCPStore and the others connect; and ``init_process_group`` prefixes an
  ``env://`` store ``"default_pg"`` (``reform.DEFAULT_PREFIX``); read from their source. The meeting itself:
  tests/integration/trainer/test_heal_multiprocess.py.
- ``DistributedDataParallel``'s ``device_ids``, ``forward_sync_buffers``, ``find_unused_parameters``,
  ``gradient_as_bucket_view`` (sync/heal.py wraps a healed module again with the old wrapper's options;
  a wrapper without forward buffer sync again with ``broadcast_buffers=False``, deprecated in 2.15 but the
  one switch that also skips the sync at start): attributes of a wrapper, not underscored but not
  documented either.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import pickle
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from testcluster.ci import skip_or_fail

try:
    import torch
except ImportError as error:
    skip_or_fail(f"the trainer's half needs torch (the venv has it): {error}")

RUN_ID = "contract"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _launcher_args(port: int, *extra: str) -> Any:
    """torchrun's parsed arguments as the launcher gets them for an elastic job's node (not host of the
    store: an external store, here one this test hosts)."""
    from torch.distributed import run as torchrun

    from ddp_trainer import contract

    return torchrun.parse_args(  # type: ignore[no-untyped-call]
        [
            "--nnodes=1:2",
            "--nproc-per-node=1",
            "--max-restarts=3",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id={RUN_ID}",
            f"--rdzv-conf=is_host=0,{contract.ELASTIC_RDZV_CONF}",
            *extra,
            "--module",
            "ddp_trainer",
            "--steps=1",
        ]
    )


@pytest.fixture
def port() -> int:
    return _free_port()


@pytest.fixture
def rendezvous(port: int, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The handler torch builds for the launcher's elastic settings (its own registry, its own client
    store), on a store this test hosts on 127.0.0.1:``port``."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry

    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))  # config_from_args sets it
    host = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    config, _, _ = torchrun.config_from_args(_launcher_args(port))
    params = RendezvousParameters(  # as torch's launch_agent builds them from the config
        backend=config.rdzv_backend,
        endpoint=config.rdzv_endpoint,
        run_id=config.run_id,
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        local_addr=config.local_addr,
        **config.rdzv_configs,
    )
    handler = rendezvous_handler_registry.create_handler(params)
    yield handler
    del handler, host


def _enter(handler: Any, *others: Any) -> None:
    """This node (and ``others``) in the stored state as participants with fresh heartbeats, written
    through torch's own state holder."""
    holder = handler._state_holder
    holder.sync()
    now = datetime.now(UTC)
    for rank, node in enumerate((handler._this_node, *others)):
        holder.state.participants[node] = rank
        holder.state.last_heartbeats[node] = now
    holder.mark_dirty()
    holder.sync()


def test_the_rendezvous_state_has_the_fields_the_launcher_reads_and_pickles() -> None:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

    state = _RendezvousState()
    node = _NodeDesc("host-a", 7, 0)
    state.participants[node] = 0
    state.last_heartbeats[node] = datetime.now(UTC)
    copy = pickle.loads(pickle.dumps(state))
    for field, kind in {"round": int, "closed": bool, "participants": dict, "last_heartbeats": dict}.items():
        assert isinstance(getattr(copy, field, None), kind), (
            f"_RendezvousState.{field} is no longer a {kind.__name__} (launch/rounds.py, launch/store.py)"
        )
    (only,) = copy.participants
    assert isinstance(only, _NodeDesc), "_RendezvousState.participants no longer keys by _NodeDesc"
    assert (only.addr, only.pid) == ("host-a", 7), "_NodeDesc no longer carries addr and pid"
    assert only in copy.last_heartbeats and only == node, "_NodeDesc no longer hashes by value"
    assert isinstance(copy.last_heartbeats[only], datetime), "_RendezvousState.last_heartbeats: datetimes"
    assert "host-a" in repr(only) and "7" in repr(only), "_NodeDesc's repr (store.drop's message) names it"


def test_a_dropped_heartbeat_is_removed_by_torchs_own_sanitizer(rendezvous: Any) -> None:
    """launch/store.drop marks an ended agent's heartbeat long ago; torch's next read of the state removes
    the node (``_BackendRendezvousStateHolder._sanitize`` on ``_RendezvousState.last_heartbeats``)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

    from ddp_trainer.launch import store

    other = _NodeDesc("host-b", 9, 0)
    _enter(rendezvous, other)
    assert store.drop(rendezvous._store, RUN_ID, "host-b", 9) == [repr(other)], (
        "store.drop could not read or write _RendezvousState through C10dRendezvousBackend's get/set_state"
    )
    holder = rendezvous._state_holder
    holder.mark_dirty()  # its write fails the compare-and-set: torch reads the stored state and sanitizes it
    holder.sync()
    assert other not in holder.state.participants and other not in holder.state.last_heartbeats, (
        "torch's sanitizer (_BackendRendezvousStateHolder._sanitize) no longer drops a node whose "
        "_RendezvousState.last_heartbeats entry is long past (store.drop's LONG_AGO, a UTC datetime)"
    )
    assert rendezvous._this_node in holder.state.participants, "the sanitizer dropped a live node"


def test_the_handler_torch_builds_has_the_settings_store_and_node_the_launcher_reads(
    rendezvous: Any, port: int
) -> None:
    from torch.distributed import TCPStore  # type: ignore[attr-defined]
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        _NodeDesc,
        _RendezvousState,
    )

    assert type(rendezvous) is DynamicRendezvousHandler, (
        f"torch's c10d rendezvous is a {type(rendezvous).__name__}, not the DynamicRendezvousHandler whose "
        "private parts the launcher reads"
    )
    settings = getattr(rendezvous, "_settings", None)
    assert settings is not None, "DynamicRendezvousHandler._settings is gone"
    assert settings.run_id == RUN_ID, "DynamicRendezvousHandler._settings.run_id"
    assert isinstance(settings.keep_alive_interval, timedelta), (
        "DynamicRendezvousHandler._settings.keep_alive_interval is no longer a timedelta"
    )
    assert isinstance(settings.keep_alive_max_attempt, int), (
        "DynamicRendezvousHandler._settings.keep_alive_max_attempt is no longer an int"
    )
    bound = settings.keep_alive_interval * settings.keep_alive_max_attempt
    assert bound == timedelta(seconds=5), (
        "DynamicRendezvousHandler._settings: the keep-alive bound (interval × max attempts) is not the "
        f"launcher's conf's 1 s × 5 (contract.ELASTIC_RDZV_CONF): {bound}"
    )
    client = getattr(rendezvous, "_store", None)
    assert isinstance(client, TCPStore), f"DynamicRendezvousHandler._store is a {type(client).__name__}"
    assert (client.host, client.port) == ("127.0.0.1", port), "DynamicRendezvousHandler._store.host/.port"
    assert client.timeout == timedelta(seconds=15), (  # type: ignore[attr-defined]
        "DynamicRendezvousHandler._store.timeout is not the read_timeout=15 of the launcher's conf: "
        "c10d_rendezvous_backend._create_tcp_store no longer reads read_timeout"
    )
    me = getattr(rendezvous, "_this_node", None)
    assert isinstance(me, _NodeDesc), f"DynamicRendezvousHandler._this_node is a {type(me).__name__}"
    assert (me.addr, me.pid) == (socket.getfqdn(), os.getpid()), (
        "DynamicRendezvousHandler._this_node is no longer (getfqdn(), getpid()), the name store.announce "
        "gives the store's process watch"
    )
    holder = getattr(rendezvous, "_state_holder", None)
    assert holder is not None, "DynamicRendezvousHandler._state_holder is gone"
    assert isinstance(holder.state, _RendezvousState), "DynamicRendezvousHandler._state_holder.state"
    assert isinstance(getattr(holder, "_backend", None), C10dRendezvousBackend), (
        "DynamicRendezvousHandler._state_holder._backend is no longer the C10dRendezvousBackend "
        "(RoundWatch.reconnect replaces it)"
    )


def test_the_round_watch_reads_and_reconnects_through_torchs_handler(
    rendezvous: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher's own reader (launch/rounds.RoundWatch) on the real handler: a round begun, the state
    read, and a reconnect that torch's handler then uses."""
    from ddp_trainer.launch.rounds import RoundWatch

    _enter(rendezvous)
    watch = RoundWatch(rendezvous)
    assert watch.watch.bound == 5.0 and watch.run_id == RUN_ID and watch.store is rendezvous._store
    watch.begin()
    assert watch.watch.me == rendezvous._this_node and watch.watch.members == {rendezvous._this_node}, (
        "_state_holder.state.participants / _this_node as RoundWatch.begin reads them"
    )
    assert watch.poll(force=True) is None and watch.failed_reads == 0, (
        "RoundWatch could not read _RendezvousState (round, participants, last_heartbeats, closed) as stored"
    )
    old = rendezvous._store
    watch.reconnect()
    assert rendezvous._store is watch.store and watch.store is not old, "DynamicRendezvousHandler._store"
    assert (watch.store.host, watch.store.port, watch.store.timeout) == (old.host, old.port, old.timeout)
    assert watch.reconnects == 1, "RoundWatch.reconnects (the agent renews its own store by it)"
    wrapped = rendezvous._get_store()  # what agent._install gives the agent after a reconnect
    wrapped.set("exit-barrier-probe", b"1")
    key = f"torch.rendezvous.{RUN_ID}.{rendezvous._state_holder.state.round}/exit-barrier-probe"
    assert watch.store.check([key]), "DynamicRendezvousHandler._get_store() no longer wraps _store"
    holder = rendezvous._state_holder
    assert holder._backend is watch.backend, "DynamicRendezvousHandler._state_holder._backend"
    wrote: list[object] = []
    write = watch.backend.set_state

    def counted(state: bytes, token: Any = None) -> Any:
        wrote.append(state)
        return write(state, token)

    monkeypatch.setattr(watch.backend, "set_state", counted)
    holder.mark_dirty()
    holder.sync()
    assert wrote, "torch's state holder no longer writes through _state_holder._backend (set after creation)"
    assert watch.poll(force=True) is None and watch.failed_reads == 0, "RoundWatch after reconnect"


def test_a_store_that_comes_back_empty_gets_the_round_back_through_torchs_backend_and_holder(
    rendezvous: Any,
) -> None:
    """RoundWatch.restore on the real handler: the store emptied (as a new store process is), the watch
    reconnects (its new C10dRendezvousBackend marks the empty state), writes its view back under torch's
    compare-and-set against the empty mark, and torch's own state holder takes the round from there."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

    from ddp_trainer.launch.rounds import RoundWatch

    other = _NodeDesc("host-b", 9, 0)
    _enter(rendezvous, other)
    holder = rendezvous._state_holder
    holder.state.round, holder.state.complete = 3, True
    holder.mark_dirty()
    holder.sync()
    watch = RoundWatch(rendezvous)
    watch.begin()
    assert watch.view is not None, "RoundWatch.begin kept no view of a round this node is in"
    rendezvous._store.delete_key("torch.rendezvous." + RUN_ID)  # what a new store process holds: nothing
    watch.failed_reads = 1  # the old store was lost: the next poll reconnects
    old = rendezvous._store
    assert watch.poll(force=True) is None and watch.failed_reads == 0
    assert rendezvous._store is not old, "RoundWatch did not reconnect"
    got = watch.backend.get_state()
    assert got is not None, (
        "RoundWatch.restore wrote nothing: C10dRendezvousBackend made on an empty store no longer marks it "
        "empty, or set_state(state) with no token is no longer a compare-and-set against that mark"
    )
    again = watch.backend.set_state(pickle.dumps(holder.state))  # a second node's restore, a moment late
    assert again is not None and again[2] is False and again[1] == got[1], (
        "C10dRendezvousBackend.set_state(state) with no token overwrote a restored state"
    )
    holder.sync()
    state = holder.state
    assert (state.round, state.complete) == (3, True), "torch's state holder did not read the restored round"
    assert set(state.participants) == {rendezvous._this_node, other}, (
        "torch's sanitizer dropped a node of the restored round: its refreshed keep-alive (a UTC datetime "
        "of now) is no longer what _sanitize compares"
    )


def test_a_heals_round_closes_once_the_survivors_joined_not_after_the_last_call(rendezvous: Any) -> None:
    """launch/heal_meeting.closing_at on the real handler (min 1, max 2 nodes): the round a lone survivor
    joins under it closes at once, where torch would wait its last call for a second node; a longer last
    call reaches both copies of the settings (the handler's and its op executor's), which are put back
    after; members_alive reads torch's state."""
    import dataclasses
    import time

    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousTimeout

    from ddp_trainer.launch import heal_meeting
    from ddp_trainer.launch.rounds import RoundWatch

    assert rendezvous._op_executor._settings is rendezvous._settings, (
        "_DistributedRendezvousOpExecutor._settings"
    )
    # a last call far longer than a round that closes at once takes, however loaded the machine
    was = rendezvous._settings.timeout
    timeout = RendezvousTimeout(was.join, timedelta(seconds=30), was.close, was.heartbeat)
    settings = dataclasses.replace(rendezvous._settings, timeout=timeout)
    rendezvous._settings = rendezvous._op_executor._settings = settings
    last_call = settings.timeout.last_call.total_seconds()
    started = time.monotonic()
    with heal_meeting.closing_at(rendezvous, heal_meeting.Meeting(1, joining=False)):
        assert rendezvous._settings.max_nodes == rendezvous._op_executor._settings.max_nodes == 1
        info = rendezvous.next_rendezvous()
    took = time.monotonic() - started
    assert rendezvous._settings is settings and rendezvous._op_executor._settings is settings
    assert info.world_size == 1 and took < last_call, (took, last_call)
    watch = RoundWatch(rendezvous)
    watch.begin()
    assert heal_meeting.members_alive(watch) == heal_meeting.Meeting(1, joining=False)
    # a node on its way between rounds (torch's exit took its keep-alive away) counts once it named itself
    heal_meeting.say_healing(watch, 7)
    watch.store.append(heal_meeting.healers_key(watch.run_id, 7), "127.0.0.9_4242_0;")
    assert heal_meeting.members_alive(watch, 7) == heal_meeting.Meeting(2, joining=False), "this node once"
    assert heal_meeting.members_alive(watch, 8) == heal_meeting.Meeting(1, joining=False), "another round's"

    def meets(nodes: int, joining: bool) -> Any:
        return heal_meeting.closing_at(rendezvous, heal_meeting.Meeting(nodes, joining), last_call=40.0)

    with heal_meeting.closing_at(rendezvous, heal_meeting.Meeting(2, joining=False)), meets(3, joining=True):
        assert rendezvous._settings is settings, "max_nodes already and no longer last call; above max_nodes"
    with meets(2, joining=False):
        assert rendezvous._settings is settings, "a round of max_nodes that no node joins waits no longer"
    for meeting in (meets(2, joining=True), meets(1, joining=False)):  # a grow; fewer than max_nodes
        with meeting:
            for held in (rendezvous._settings, rendezvous._op_executor._settings):
                assert held.timeout.last_call == timedelta(seconds=40), held
                assert held.timeout.join == was.join and held.timeout.heartbeat == was.heartbeat, held
        assert rendezvous._settings is settings and rendezvous._op_executor._settings is settings


def test_a_heals_round_closes_when_its_nodes_joined_whoever_joined_first(rendezvous: Any) -> None:
    """launch/heal_meeting.closing_when_full on torch's join op, with the real handler's settings: a round
    this node joined first (its deadline a long last call away: torch sets it as the first node joins) is
    closed by this node once the participants reach its ``max_nodes``, where torch closes it at that count
    only as a node adds itself, by the adding node's settings (a healer that counted a dead node keeps a
    larger one). Fewer participants than this node's ``max_nodes`` still wait; torch's op is put back."""
    import dataclasses
    import time
    from datetime import UTC, datetime

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    from ddp_trainer.launch import heal_meeting

    me, other = rdzv._NodeDesc("127.0.0.1", 11, 0), rdzv._NodeDesc("127.0.0.2", 12, 0)
    state = rdzv._RendezvousState()
    now = datetime.now(UTC)
    state.participants, state.last_heartbeats = {me: 0, other: 0}, {me: now, other: now}
    state.deadline = now + timedelta(seconds=30)  # this node's last call, set as it joined first
    settings = dataclasses.replace(rendezvous._settings, min_nodes=1, max_nodes=2)
    ctx, wider = (
        rdzv._RendezvousContext(me, state, s) for s in (settings, dataclasses.replace(settings, max_nodes=3))
    )
    op, original, deadline = rdzv._RendezvousJoinOp(), rdzv._RendezvousJoinOp.__call__, time.monotonic() + 60
    closes = rdzv._Action.MARK_RENDEZVOUS_COMPLETE
    assert op(ctx, deadline) != closes, "torch now closes a full round its node joined before the last call"
    with heal_meeting.closing_when_full():
        assert op(ctx, deadline) == closes, "the heal's round of 2, both joined"
        assert op(wider, deadline) != closes, "a round of 3 that 2 joined waits"
        state.complete = True
        assert op(ctx, deadline) == rdzv._Action.FINISH, "a closed round's participant goes on as torch's"
    assert rdzv._RendezvousJoinOp.__call__ is original


def test_a_heals_rendezvous_polls_torchs_state_faster_than_every_second(rendezvous: Any) -> None:
    """launch/heal_meeting.polling: torch's op executor waits for state changes with the module-level
    ``_delay(seconds=1)`` of dynamic_rendezvous (its SYNC action), and its handler's state holder serves
    the state it read within ``_cache_duration`` (1 s) of its last read instead of reading it again; the
    heal's rendezvous makes both POLL_SECONDS, leaves the compare-and-set back-off (a range) as it is, and
    puts torch's back after."""
    import inspect
    import time

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    from ddp_trainer.launch import heal_meeting

    run = inspect.getsource(rdzv._DistributedRendezvousOpExecutor.run)
    assert "_delay(seconds=1)" in run, "torch's rendezvous no longer polls with _delay(seconds=1)"
    holder = rendezvous._state_holder
    assert holder._cache_duration == 1, "torch's state holder no longer caches its state for 1 s"
    original = rdzv._delay
    with heal_meeting.polling(rendezvous):
        started = time.monotonic()
        rdzv._delay(seconds=1)
        rdzv._delay(seconds=(0, 0.01))
        took = time.monotonic() - started
        assert holder._cache_duration == heal_meeting.POLL_SECONDS
        holder.sync()  # reads the stored state (none yet): a read a while ago
        time.sleep(heal_meeting.POLL_SECONDS * 1.5)
        before = holder._last_sync_time
        holder.sync()  # past the heal's cache: read again
        assert holder._last_sync_time > before, "the state holder served its cache past the heal's poll"
    assert rdzv._delay is original and took < 0.6, took
    assert holder._cache_duration == 1


def test_num_nodes_waiting_keeps_the_shape_the_launcher_wraps(rendezvous: Any) -> None:
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    from ddp_trainer.launch.rounds import patient

    method = DynamicRendezvousHandler.num_nodes_waiting
    params = list(inspect.signature(method).parameters)
    assert params == ["self"], (
        f"DynamicRendezvousHandler.num_nodes_waiting{params}: rounds.patient wraps (self)"
    )
    assert type(rendezvous).num_nodes_waiting is method, "the c10d handler overrides num_nodes_waiting"
    assert "rdzv_handler.num_nodes_waiting()" in inspect.getsource(SimpleElasticAgent._invoke_run), (
        "SimpleElasticAgent._invoke_run no longer asks num_nodes_waiting() of the handler"
    )
    waiting = patient(method)(rendezvous)
    assert waiting == 0 and type(method(rendezvous)) is int, "DynamicRendezvousHandler.num_nodes_waiting"


def test_the_share_store_switch_the_launcher_sets_is_still_read(
    rendezvous: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")  # what launch/agent.main sets
    assert rendezvous.use_agent_store is False, (
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 no longer makes each round's workers a store of their own"
    )
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "0")
    assert rendezvous.use_agent_store is True, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def test_the_agent_methods_the_launcher_wraps_keep_their_signatures() -> None:
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    for owner, method in ((LocalElasticAgent, "_monitor_workers"), (SimpleElasticAgent, "_rendezvous")):
        assert method in vars(owner), f"{owner.__name__}.{method} is gone (the launcher patches it there)"
        params = list(inspect.signature(getattr(owner, method)).parameters)
        assert params == ["self", "worker_group"], (
            f"{owner.__name__}.{method}{params}: the launcher's wrapper takes (self, worker_group)"
        )
    assert "_rendezvous" not in vars(LocalElasticAgent), (
        "LocalElasticAgent overrides _rendezvous: the launcher's patch of SimpleElasticAgent._rendezvous "
        "would not run"
    )
    assert "self._monitor_workers(self._worker_group)" in inspect.getsource(SimpleElasticAgent._invoke_run), (
        "SimpleElasticAgent._invoke_run no longer calls _monitor_workers(worker_group) positionally"
    )
    assert "self._rendezvous(worker_group)" in inspect.getsource(SimpleElasticAgent._initialize_workers), (
        "SimpleElasticAgent._initialize_workers no longer calls _rendezvous(worker_group) positionally"
    )
    rendezvous = inspect.getsource(SimpleElasticAgent._rendezvous)
    assert "spec.rdzv_handler.next_rendezvous()" in rendezvous, "SimpleElasticAgent._rendezvous: rdzv_handler"
    assert "worker_group.group_world_size =" in rendezvous, (
        "SimpleElasticAgent._rendezvous no longer sets worker_group.group_world_size (Book.rendezvoused)"
    )


def _noop() -> None:
    """An entrypoint for a WorkerSpec whose workers never start."""


def test_a_real_agent_has_the_restarts_and_process_context_the_launcher_reads(
    rendezvous: Any, tmp_path: Path
) -> None:
    from torch.distributed.elastic.agent.server.api import (
        RunResult,
        SimpleElasticAgent,
        Worker,
        WorkerSpec,
        WorkerState,
    )
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
    from torch.multiprocessing.spawn import ProcessContext

    assert "store=self._store" in inspect.getsource(SimpleElasticAgent._exit_barrier), (
        "SimpleElasticAgent._exit_barrier no longer waits on self._store (agent.py renews it on a reconnect)"
    )

    spec = WorkerSpec(
        role="trainer", local_world_size=1, rdzv_handler=rendezvous, entrypoint=_noop, max_restarts=3
    )
    agent = LocalElasticAgent(spec, DefaultLogsSpecs(log_dir=str(tmp_path / "agent")), start_method="spawn")
    restarts = getattr(agent, "_remaining_restarts", None)
    assert type(restarts) is int and restarts == 3, (
        f"SimpleElasticAgent._remaining_restarts is {restarts!r} on an agent of max_restarts=3"
    )
    assert "self._remaining_restarts -= 1" in inspect.getsource(SimpleElasticAgent._invoke_run), (
        "SimpleElasticAgent._invoke_run no longer spends _remaining_restarts on a restart"
    )
    assert "_pcontext" in vars(agent) and agent._pcontext is None, "LocalElasticAgent._pcontext"
    group = agent.get_worker_group()
    assert group.spec.rdzv_handler is rendezvous, "WorkerGroup.spec.rdzv_handler"
    assert hasattr(group, "group_world_size") and hasattr(group, "workers"), "WorkerGroup fields"
    worker = Worker(local_rank=0, global_rank=4)
    assert (worker.local_rank, worker.global_rank, worker.id) == (0, 4, None), "Worker fields"

    # the process context of a function entrypoint (the built-in trainer's): _ended reads ._pc.processes
    # and .error_files, by local rank
    context = MultiprocessContext(
        name="trainer",
        entrypoint=_noop,
        args={0: ()},
        envs={0: {}},
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path / "context")),
    )
    assert "_pc" in vars(context) and context._pc is None, "MultiprocessContext._pc"
    start = inspect.getsource(MultiprocessContext._start)
    assert "self._pc = mp.start_processes(" in start and "join=False" in start, (
        "MultiprocessContext._start no longer keeps torch.multiprocessing's ProcessContext in _pc"
    )
    processes = ProcessContext([], []).processes  # type: ignore[no-untyped-call]
    assert processes == [], "torch.multiprocessing.ProcessContext.processes"
    assert isinstance(context.error_files, dict) and isinstance(context.error_files[0], str), (
        "PContext.error_files is no longer {local rank: path}"
    )
    failure = ProcessFailure(0, 12345, 86, str(tmp_path / "none.json"))  # positional, as agent._ended
    assert failure.exitcode == 86 and isinstance(failure.message, str), "ProcessFailure(local_rank, pid, …)"
    assert {"state", "failures"} <= set(inspect.signature(RunResult).parameters), "RunResult(state, failures)"
    assert {"HEALTHY", "FAILED", "UNHEALTHY"} <= set(WorkerState.__members__), "WorkerState"


def test_a_round_whose_rank_assignment_times_out_raises_dist_store_error() -> None:
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    assigned = inspect.getsource(SimpleElasticAgent._assign_worker_ranks)
    assert "role_info" in assigned.lower() or "ROLE_INFO_PREFIX" in assigned, (
        "SimpleElasticAgent._assign_worker_ranks no longer waits for each node's role info in the store"
    )
    assert issubclass(torch.distributed.DistStoreError, RuntimeError), "torch.distributed.DistStoreError"


def test_torchrun_config_from_args_is_the_hook_the_warm_start_replaces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch.distributed import run as torchrun

    from ddp_trainer.launch.warm import runs_builtin

    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    params = list(inspect.signature(torchrun.config_from_args).parameters)
    assert params == ["args"], f"torch.distributed.run.config_from_args{params}"
    assert "config_from_args(args)" in inspect.getsource(torchrun.run), (
        "torch.distributed.run.run no longer looks config_from_args up on its module "
        "(warm.warm_config_from_args replaces it there)"
    )
    args = _launcher_args(_free_port(), "--local-addr=node-a")
    for field in ("module", "training_script", "no_python", "run_path", "training_script_args", "rdzv_id"):
        assert hasattr(args, field), f"torch.distributed.run.parse_args(...).{field}"
    assert runs_builtin(args) and args.rdzv_id == RUN_ID and args.local_addr == "node-a"
    got = torchrun.config_from_args(args)
    assert isinstance(got, tuple) and len(got) == 3, "config_from_args returns (config, entrypoint, args)"
    config, _, script_args = got
    assert hasattr(config, "start_method") and script_args == ["-u", "-m", "ddp_trainer", "--steps=1"], (
        "torch.distributed.run.config_from_args: LaunchConfig.start_method, the script's args"
    )


def test_the_trainers_private_torch_calls() -> None:
    """sync/fingerprints/torch_kernel.py and core/wrappers.py (the trainer, and the no-code hook)."""
    zeroed = [torch.ones(3), torch.ones(2, dtype=torch.int64)]
    torch._foreach_zero_(zeroed)
    assert all(not t.any() for t in zeroed), "torch._foreach_zero_ no longer zeroes a list of tensors"
    into = [torch.empty(3), torch.empty(2, dtype=torch.int64)]
    torch._foreach_copy_(into, [torch.arange(3.0), torch.tensor([5, 6])])
    assert into[0].tolist() == [0.0, 1.0, 2.0] and into[1].tolist() == [5, 6], "torch._foreach_copy_"

    from torch.cuda import jiterator

    params = list(inspect.signature(jiterator._create_jit_fn).parameters)
    assert params[:1] == ["code_string"], f"torch.cuda.jiterator._create_jit_fn{params}"

    # torch.compile's wrapper, read from torch's source: importing torch._dynamo costs seconds
    assert importlib.util.find_spec("torch._dynamo") is not None, "torch._dynamo (warm.warm_failure_path)"
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.submodule_search_locations, "torch's package folder"
    source = Path(next(iter(spec.submodule_search_locations)))
    tree = ast.parse((source / "_dynamo" / "eval_frame.py").read_text())
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "OptimizedModule"]
    assert found, "torch._dynamo.eval_frame.OptimizedModule (matched by name) is gone"
    assigned = {
        target.attr
        for node in ast.walk(found[0])
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == "self"
    }
    assert "_orig_mod" in assigned, "OptimizedModule no longer keeps the compiled module in _orig_mod"


def test_the_env_store_a_heal_mirrors_and_the_ddp_options_it_copies() -> None:
    """core/reform.py ``bootstrap_store`` and sync/heal.py ``_options``."""
    from torch.distributed import distributed_c10d
    from torch.nn.parallel import DistributedDataParallel

    from ddp_trainer.core import reform

    rendezvous = importlib.import_module("torch.distributed.rendezvous")  # the package's name is a function
    params = list(inspect.signature(rendezvous._create_c10d_store).parameters)
    assert params[:5] == ["hostname", "port", "rank", "world_size", "timeout"], params
    made = inspect.getsource(rendezvous._create_c10d_store).replace(" ", "")
    said_by_torch = ("start_daemon=rank==0", "is_master=start_daemon", "multi_tenant=True", "use_libuv=")
    for said in said_by_torch:
        assert said in made, f"rendezvous._create_c10d_store no longer says {said}"
    assert f'PrefixStore("{reform.DEFAULT_PREFIX}",store)' in inspect.getsource(
        distributed_c10d.init_process_group
    ).replace(" ", ""), "init_process_group's env:// prefix"
    init = inspect.getsource(DistributedDataParallel.__init__)
    for name in ("device_ids", "forward_sync_buffers", "find_unused_parameters", "gradient_as_bucket_view"):
        assert f"self.{name} =" in init, f"DistributedDataParallel no longer keeps self.{name}"
    assert "broadcast_buffers" in inspect.signature(DistributedDataParallel).parameters


def test_the_rendezvous_a_heal_runs_without_a_restart_leaves_what_it_reads() -> None:
    """launch/heal_round.py: the workers torch's rendezvous makes anew, and why their ids must be put back."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, Worker
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    rendezvous = inspect.getsource(SimpleElasticAgent._rendezvous)
    for said in (
        "worker_group.workers = workers",
        "worker_group.group_rank =",
        "worker_group.master_addr =",
        "worker_group.master_port =",
        "self._assign_worker_ranks(",
    ):
        assert said in rendezvous, f"SimpleElasticAgent._rendezvous no longer says {said}"
    worker = Worker(local_rank=1, global_rank=5, role_rank=5, world_size=6, role_world_size=6)
    assert (worker.id, worker.local_rank, worker.global_rank, worker.world_size) == (None, 1, 5, 6), "Worker"
    assert list(inspect.signature(SimpleElasticAgent._restart_workers).parameters) == ["self", "worker_group"]
    assert "_restart_workers" not in vars(LocalElasticAgent), "LocalElasticAgent overrides _restart_workers"
    run = inspect.getsource(SimpleElasticAgent._invoke_run)
    healthy = run.split("elif state == WorkerState.HEALTHY:", 1)[-1]
    assert "num_nodes_waiting()" in healthy and "self._restart_workers(self._worker_group)" in healthy, (
        "_invoke_run's healthy branch no longer restarts the workers for a waiting node"
    )
    assert "_remaining_restarts -= 1" not in healthy.split("else:", 1)[0], "a waiting node spends a restart"
    monitor = inspect.getsource(LocalElasticAgent._monitor_workers)
    assert "{w.id for w in worker_group.workers}" in monitor and "WorkerState.UNKNOWN" in monitor, (
        "LocalElasticAgent._monitor_workers no longer compares the workers' ids with its processes' pids"
    )
