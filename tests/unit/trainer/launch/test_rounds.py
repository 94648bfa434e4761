"""A rendezvous store that comes back empty (launch/rounds.RoundWatch.restore): the first node to find it
empty writes its last view of its round back, every keep-alive held ahead while the others reach the new
store, with the gather count a later node waits for; the others find it there and write nothing; a node
with no view of a round writes nothing; no member is judged silent while held; a reconnect to a store that
does not answer fails at once.
Each watch reads through a real TCPStore on 127.0.0.1 (torch's own c10d backend), the handler a stand-in
with the fields torch's has (tests/contract/test_torch_private.py checks torch's)."""

from __future__ import annotations

import pickle
import socket
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from ddp_trainer.launch import rounds
from ddp_trainer.launch.store import ARRIVED_KEY

RUN_ID = "restore"
LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def host() -> Any:
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    return TCPStore(
        "127.0.0.1", _free_port(), is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5)
    )


def _node(addr: str) -> Any:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

    return _NodeDesc(addr, 1, 0)


def _handler(host: Any, me: Any, members: list[Any], round_number: int = 4) -> Any:
    """A handler whose last round (``round_number``) had ``members``, heartbeats long ago."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState

    state = _RendezvousState()
    state.round, state.complete = round_number, True
    for rank, node in enumerate(members):
        state.participants[node], state.last_heartbeats[node] = rank, LONG_AGO
    client = TCPStore(host.host, host.port, is_master=False, wait_for_workers=False, timeout=host.timeout)
    settings = SimpleNamespace(
        run_id=RUN_ID, keep_alive_interval=timedelta(seconds=1), keep_alive_max_attempt=5
    )
    return SimpleNamespace(
        _settings=settings,
        _store=client,
        _this_node=me,
        _state_holder=SimpleNamespace(state=state, _backend=None),
    )


def _stored(watch: rounds.RoundWatch) -> Any:
    got = watch.backend.get_state()
    return pickle.loads(got[0]) if got else None


def test_refreshed_holds_every_keep_alive_ahead_and_keeps_the_round() -> None:
    state = SimpleNamespace(round=3, participants={"a": 0, "b": 1}, last_heartbeats={"a": LONG_AGO, "b": 1})
    now = datetime.now(UTC)
    until = now + timedelta(seconds=30)
    assert rounds.refreshed(state, until) is state
    assert state.last_heartbeats == {"a": until, "b": until} and state.participants == {"a": 0, "b": 1}
    assert rounds.held(state.last_heartbeats, now) == ["a", "b"]
    assert rounds.held({"a": now, "b": LONG_AGO, "c": 7}, now + timedelta(seconds=1)) == []


def test_a_member_whose_keep_alive_is_held_is_not_judged_silent_until_the_hold_and_the_bound_passed() -> None:
    """The store came back empty and one node gave it the round back, every keep-alive held ahead: a
    member still reaching the new store (its keep-alive unchanged) is not silent while held; one lost
    meanwhile is judged the keep-alive bound (and the margin) after its hold ended."""
    from ddp_trainer.launch import silence

    watch = silence.Watch(bound=5.0)
    beats = {"a": 1, "b": 1}
    watch.begin(1, "a", {"a": 0, "b": 1}, beats, now=0.0)
    now = 0.0
    while now < 30.0:  # held for 30 s (two read timeouts): polled every 0.5 s, never judged
        now += silence.POLL_SECONDS
        watch.excuse(["b"], now)
        assert watch.observe(1, {"a": 0, "b": 1}, beats, None, now) is None, now
    while (verdict := watch.observe(1, {"a": 0, "b": 1}, beats, None, now)) is None:
        now += silence.POLL_SECONDS
        assert now < 40.0
    assert verdict.kind == silence.SILENT and verdict.nodes == ("b",)
    assert now == 30.0 + 5.0 + silence.MARGIN_SECONDS


def test_a_reconnect_to_a_store_that_does_not_answer_fails_at_once() -> None:
    """torch's client retries its connection with a growing back-off until its timeout and missed a store
    that came up meanwhile by seconds; the watch probes with a plain connection first, so a store that does
    not answer fails the poll at once and the next poll (0.5 s later) tries again."""
    import gc
    import time

    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    server = TCPStore(
        "127.0.0.1", _free_port(), is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5)
    )
    watch = rounds.RoundWatch(_handler(server, _node("a"), [_node("a")]))
    del server
    gc.collect()  # the store's process is gone
    began = time.monotonic()
    with pytest.raises(OSError):
        watch.reconnect()
    assert time.monotonic() - began < rounds.PROBE_SECONDS + 0.5 and watch.reconnects == 0


def test_the_first_node_to_find_the_store_empty_restores_its_round_and_the_others_find_it(
    host: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b, c = _node("a"), _node("b"), _node("c")
    first, second = (rounds.RoundWatch(_handler(host, me, [a, b, c])) for me in (a, b))
    for watch in (first, second):
        watch.begin()
    assert _stored(first) is None  # the store holds nothing: a new store
    before = datetime.now(UTC)
    assert first.poll(force=True) is None and first.failed_reads == 0
    restored = _stored(first)
    assert restored.round == 4 and restored.complete and set(restored.participants) == {a, b, c}
    assert first.grace == 2 * 5.0  # two read timeouts of the store's client (5 s here)
    hold = before + timedelta(seconds=first.grace)
    assert all(beat >= hold for beat in restored.last_heartbeats.values()), restored.last_heartbeats
    assert int(host.add(ARRIVED_KEY, 0)) == 3  # a later node's gather finds the job's nodes came
    said = capsys.readouterr().err
    assert (
        "[launcher] the rendezvous store came back empty: restored round 4 with 3 node(s) from this node's "
        "last view, each node's keep-alive held 10 s for it to reach the new store"
    ) in said, said

    token = first.backend.get_state()
    assert second.poll(force=True) is None and second.failed_reads == 0
    assert first.backend.get_state() == token, "the second node wrote over the restored state"
    assert int(host.add(ARRIVED_KEY, 0)) == 3 and "restored" not in capsys.readouterr().err


def test_a_node_that_keeps_reading_its_round_restores_the_latest_view(host: Any) -> None:
    a, b = _node("a"), _node("b")
    watch = rounds.RoundWatch(_handler(host, a, [a, b]))
    watch.begin()
    watch.poll(force=True)  # restores round 4 into the empty store
    later = _stored(watch)
    later.wait_list.add(_node("c"))  # a node came meanwhile, and waits for the next round
    watch.backend.set_state(pickle.dumps(later), watch.backend.get_state()[1])
    watch.poll(force=True)
    assert _node("c") in pickle.loads(watch.view).wait_list  # type: ignore[arg-type]


def test_a_node_with_no_view_of_a_round_writes_nothing(host: Any) -> None:
    a, b = _node("a"), _node("b")
    watch = rounds.RoundWatch(_handler(host, a, [b]))  # its rendezvous returned without it
    watch.begin()
    assert watch.view is None
    assert watch.poll(force=True) is None and _stored(watch) is None


def test_each_node_says_where_it_runs_so_a_silent_one_is_named_with_its_kubernetes_node(
    host: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each agent writes its Kubernetes node (DDPJOB_NODE_NAME) once, at its first round; the others read
    it while the store answers, so a verdict names the silent pod's node, and the store's host's too
    (then the store cannot be asked)."""
    from ddp_trainer import contract

    a, b = _node("a.job"), _node("b.job")
    watches = {}
    for me, where in ((a, "real-1"), (b, "real-2")):
        monkeypatch.setenv(contract.NODE_NAME_ENV, where)
        watches[me] = rounds.RoundWatch(_handler(host, me, [a, b]))
        watches[me].begin()
    watch = watches[a]
    assert watch.name(b) == "b.job (pid 1)"  # not read yet
    watch.poll(force=True)  # restores the round into the empty store, then reads it
    assert watch.where == {"a.job": "real-1", "b.job": "real-2"}
    assert watch.name(b) == "b.job (pid 1, on node real-2)"
    assert watch.host_where("b") == ", on node real-2" and watch.host_where("c") == ""


def test_a_rigid_agents_num_nodes_waiting_is_given_up_after_the_read_timeout() -> None:
    """torch's num_nodes_waiting reads the store through a client that waits on without end when node 0
    (the store's host) is silent: the agent gets 0 after the read timeout, and 0 at once while that call is
    still in flight, so it comes back to its watch; once the call returns, its answer (or error) again."""
    import threading
    import time

    release, calls = threading.Event(), []

    def waiting(handler: Any) -> int:
        calls.append(handler)
        if len(calls) == 1:
            release.wait()
            return 7
        raise RuntimeError("connection refused")

    wrapped = rounds.bounded_waiting(waiting, seconds=0.2)
    began = time.monotonic()
    assert wrapped("h") == 0 and 0.2 <= time.monotonic() - began < 2.0
    began = time.monotonic()
    assert wrapped("h") == 0 and time.monotonic() - began < 0.1 and len(calls) == 1  # not asked again
    release.set()
    time.sleep(0.05)
    assert wrapped("h") == 7
    with pytest.raises(RuntimeError, match="connection refused"):
        wrapped("h")


def test_a_stop_signal_during_a_store_read_is_never_taken_for_the_stores_trouble() -> None:
    """torch raises its SignalException (the launcher's SIGTERM: a gang restart, a deleted pod) wherever the
    agent's main thread is, a read of an unanswering store included; the store's errors give 0 waiting, but
    the signal is raised on, or the launcher trained on past its pod's grace period."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    def store_down(handler: Any) -> int:
        raise RuntimeError("connection refused")

    def stopped(handler: Any) -> int:
        raise SignalException("Process 7 got signal: 15", sigval=15)  # type: ignore[arg-type]

    assert rounds.patient(store_down)("h") == 0
    with pytest.raises(SignalException):
        rounds.patient(stopped)("h")
    assert rounds.signalled(SignalException("x", sigval=15)) and not rounds.signalled(RuntimeError("x"))  # type: ignore[arg-type]
