"""The launcher's side of a heal (launch/heal_round.py), without torch's agent: when it is armed, what the
workers' marks say, the notice of the world torch assigned (the heal itself with real processes:
tests/integration/trainer/test_heal_multiprocess.py plays the launchers)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from ddp_trainer.core import notice
from ddp_trainer.launch import heal_meeting, heal_round
from ddp_trainer.launch.book import Book
from ddp_trainer.launch.workers import Marks

WANTED = notice.read_note(notice.HEAL_WANTED)
HEALED = notice.read_note(notice.healed_note(4, {"step": 10}))
FAILED = notice.read_note(notice.heal_failed_note(4, "the store never came"))


def test_a_heal_is_armed_when_asked_and_by_default_for_the_built_in_trainers_elastic_gloo_job() -> None:
    asked, off = {heal_round.HEAL_ENV: "1"}, {heal_round.HEAL_ENV: "0"}
    cpu = ["--device=cpu", "--steps=10"]
    assert heal_round.armed(asked)  # a user's loop that heals, a rigid job's crashed rank
    assert heal_round.armed(asked, elastic=True, builtin=["--device=cuda"])  # asked: the worker decides
    assert not heal_round.armed({})  # a user's script: asked for
    assert not heal_round.armed({}, elastic=False, builtin=cpu)  # a rigid job: asked for
    assert heal_round.armed({}, elastic=True, builtin=cpu)  # the design's default
    assert not heal_round.armed(off, elastic=True, builtin=cpu)  # turned off
    assert not heal_round.armed({heal_round.HEAL_ENV: "yes"}, elastic=True, builtin=cpu)  # only 1 asks
    assert not heal_round.armed({}, elastic=True, builtin=["--device", "cuda"])  # NCCL: a later stage


def test_the_built_in_trainers_group_is_gloos_by_its_flags_else_by_the_host() -> None:
    def never() -> bool:
        raise AssertionError("the host asked although the flags decide")

    assert heal_round.on_gloo(["--backend=gloo", "--device=cuda"], never)
    assert heal_round.on_gloo(["--backend", "gloo"], never)
    assert not heal_round.on_gloo(["--backend=nccl"], never)
    assert heal_round.on_gloo(["--backend=auto", "--device=cpu"], never)
    assert not heal_round.on_gloo(["--device", "cuda"], never)
    assert heal_round.on_gloo(["--steps=5"], lambda: False)  # auto on a host without CUDA
    assert not heal_round.on_gloo(["--device=auto"], lambda: True)
    assert not heal_round.on_gloo(["--device"], lambda: True)  # a flag without its value: not gloo
    assert heal_round.on_gloo(["--backend=GLOO", "--device=cuda"], never)  # as the trainer reads it
    assert not heal_round.on_gloo(["--device=tpu"], never)  # refused by the trainer: not gloo


def test_the_workers_are_told_whether_their_launcher_heals() -> None:
    env = {heal_round.HEAL_ENV: "0", "OTHER": "x"}
    assert not heal_round.arm(env, elastic=True, builtin=["--device=cpu"]) and env == {"OTHER": "x"}
    env = {}
    assert heal_round.arm(env, elastic=True, builtin=["--device=cpu"]) and env == {heal_round.HEAL_ENV: "1"}
    env = {heal_round.HEAL_ENV: " 1 "}
    assert heal_round.arm(env, elastic=False, builtin=None) and env == {heal_round.HEAL_ENV: "1"}


def test_a_heal_is_wanted_when_a_worker_says_so() -> None:
    assert heal_round.wanting([None, WANTED])
    assert not heal_round.wanting([None, notice.read_note("formed"), HEALED])


def test_the_heal_is_done_when_every_worker_healed_into_the_round_and_failed_when_one_says_so() -> None:
    assert heal_round.outcome([HEALED, HEALED], 4) == notice.HEALED
    assert heal_round.outcome([HEALED, WANTED], 4) is None
    assert heal_round.outcome([HEALED, HEALED], 5) is None  # an older round's marks
    assert heal_round.outcome([HEALED, FAILED], 4) == "the store never came"
    assert heal_round.outcome([], 4) is None


def test_the_notice_says_the_world_torch_assigned() -> None:
    workers = [SimpleNamespace(local_rank=i, global_rank=2 + i, world_size=4) for i in (0, 1)]
    group = SimpleNamespace(
        workers=workers, group_rank=1, group_world_size=2, master_addr="pod-0", master_port=29500
    )
    said = heal_round.notice_of(group, 7, "a worker of this pod lost a peer", 12.5)
    assert said == notice.Notice(
        7, {0: 2, 1: 3}, 4, 1, 2, "pod-0", 29500, "a worker of this pod lost a peer", 12.5
    )


def _one_worker_agent(pid: int) -> tuple[SimpleNamespace, SimpleNamespace, list[bool]]:
    """An agent whose rendezvous records whether it heals; its group: one worker (``pid``), rank 1 of 2."""
    member = SimpleNamespace(local_rank=0, global_rank=1, world_size=2, id=pid)
    group = SimpleNamespace(
        workers=[member], group_rank=1, group_world_size=2, master_addr="pod-0", master_port=29500
    )
    met: list[bool] = []
    return SimpleNamespace(_rendezvous=lambda _group, healing: met.append(healing)), group, met


@pytest.mark.parametrize("ended", [False, True], ids=["stopped", "ended"])
def test_a_refused_heal_stops_the_workers_and_books_why_as_the_restarts_cause(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ended: bool
) -> None:
    """A worker's heal-failed mark: the launcher says why, SIGKILLs its workers (or finds one ended
    already) and books the heal's failure, not their exits, as the cause of the restart in place."""
    from torch.distributed.elastic.agent.server.api import WorkerState

    code = "pass" if ended else "import time; time.sleep(60)"
    worker = subprocess.Popen([sys.executable, "-c", code])
    try:
        if ended:
            worker.wait(30)
        why = "the healed world's replica check failed at step 40"
        (tmp_path / f"worker-{worker.pid}").write_text(notice.heal_failed_note(5, why))
        agent, group, met = _one_worker_agent(worker.pid)
        book = Book(tmp_path / "state.json", elastic=True)

        def monitor(_agent: object, _group: object) -> SimpleNamespace:
            alive = worker.poll() is None
            return SimpleNamespace(state=WorkerState.HEALTHY if alive else WorkerState.FAILED)

        ways = heal_round.Healing(monitor, Marks(tmp_path), book, tmp_path / notice.NOTICE_FILE, lambda _: 5)
        result = heal_round.heal(agent, group, ways, "a worker of this pod lost a peer")
        assert met == [True] and result.state == WorkerState.FAILED
        assert worker.wait(10) == (0 if ended else -9)
        assert book.pending is not None and book.pending[0] == f"{heal_round.FELL_BACK}: {why}"
        said = capsys.readouterr().err
        assert f"the heal into round 5 failed ({why}): its workers restart from the last checkpoint" in said
    finally:
        worker.kill()
        worker.wait()


_SEVERED_THEN_HEALED = """
import sys, time
from pathlib import Path
from ddp_trainer.core import notice
folder = Path(sys.argv[1])
mark = folder / f"worker-{__import__('os').getpid()}"
mark.write_text("formed")
while not (folder / notice.SEVER_FILE).exists():  # its collective with the silent member never ends
    time.sleep(0.01)
mark.write_text(notice.healed_note(5, {"step": 40, "lost": 1}))  # severed: it failed, and healed
time.sleep(60)
"""


def test_a_silent_member_makes_the_launcher_ask_its_workers_to_sever_and_heal_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A member of the round judged silent while this pod's workers train: the launcher writes the sever
    request (a worker's watch shuts its connections down, so its blocked collective fails as after a peer's
    loss), books the silent member's cause and heals them in place. Nothing of that for another verdict, for
    workers that have not formed their group or that failed, or where the launcher does not heal."""
    from torch.distributed.elastic.agent.server.api import WorkerState

    from ddp_trainer.launch import silence

    worker = subprocess.Popen([sys.executable, "-c", _SEVERED_THEN_HEALED, str(tmp_path)])
    try:
        agent, group, met = _one_worker_agent(worker.pid)
        book = Book(tmp_path / "state.json", elastic=True)
        marks = Marks(tmp_path, builtin=True)
        path = tmp_path / notice.NOTICE_FILE
        silent = silence.Verdict(silence.SILENT, ("127.0.0.2 (pid 9)",), 5.5)
        healthy = SimpleNamespace(state=WorkerState.HEALTHY)

        def monitor(_agent: object, _group: object) -> SimpleNamespace:
            return healthy

        ways = heal_round.Healing(monitor, marks, book, path, lambda _group: 5 if met else 4)

        def silenced(verdict: silence.Verdict, result: object, heals: bool = True) -> object:
            return heal_round.when_silent(agent, group, result, verdict, ways if heals else None)

        while marks.starting([worker.pid]):  # its group formed (its mark)
            time.sleep(0.01)
        failed = SimpleNamespace(state=WorkerState.FAILED)
        dropped = silence.Verdict(silence.DROPPED, (), 0.0)
        assert silenced(dropped, healthy) is None and silenced(silent, failed) is None
        assert silenced(silent, healthy, heals=False) is None and met == []
        rigid = dataclasses.replace(ways, book=Book(tmp_path / "rigid.json"))  # no world without the node
        assert heal_round.when_silent(agent, group, healthy, silent, rigid) is None and met == []
        assert not (tmp_path / notice.SEVER_FILE).exists()
        result = silenced(silent, healthy)
        assert result is healthy and met == [True], capsys.readouterr().err
        assert (tmp_path / notice.SEVER_FILE).read_text().split()[0] == "4"  # the round of their world
        assert book.pending is not None and book.pending[0] == silent.cause() and book.silent
        said = capsys.readouterr().err
        assert "this pod's workers shut their connections down: healing this pod's workers in place" in said
        assert "healed in place into round 5" in said, said
    finally:
        worker.kill()
        worker.wait()


_LEAVES_ON = """
import sys, time
from pathlib import Path
from ddp_trainer.core import notice
folder, request = Path(sys.argv[1]), sys.argv[2]
mark = folder / f"worker-{__import__('os').getpid()}"
mark.write_text("formed")
while not (folder / request).exists():  # it trains; only this request makes it leave its group
    time.sleep(0.01)
mark.write_text(notice.HEAL_WANTED)
mark.write_text(notice.healed_note(5, {"step": 40, "lost": 0}))
time.sleep(60)
"""


@pytest.mark.parametrize("leaves_on", ["grow", "sever"])
def test_a_node_waiting_to_join_heals_the_workers_that_train_and_restarts_those_still_forming(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, leaves_on: str
) -> None:
    """torch's restart for a node that waits in the rendezvous (a grow), armed: workers that formed their
    group are asked to leave it together at the next step boundary and healed (no restart: the joiner takes
    its state from them); where none left in time (a step that does not end: ``sever``), they are asked to
    shut their connections down; workers still forming theirs get the grace to form and mark, then are
    restarted as before heals."""
    from torch.distributed.elastic.agent.server.api import WorkerState

    monkeypatch.setattr(heal_round, "GRACE_SECONDS", 0.5)
    monkeypatch.setattr(heal_round, "GROW_BOUNDARY_SECONDS", 0.5)
    request = notice.GROW_FILE if leaves_on == "grow" else notice.SEVER_FILE
    forming = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # no mark: forming
    worker = subprocess.Popen([sys.executable, "-c", _LEAVES_ON, str(tmp_path), request])
    try:
        agent, group, met = _one_worker_agent(forming.pid)
        group.state = WorkerState.HEALTHY
        book = Book(tmp_path / "state.json", elastic=True)
        marks = Marks(tmp_path, builtin=True)
        restarted: list[object] = []
        healthy = SimpleNamespace(state=WorkerState.HEALTHY)
        ways = heal_round.Healing(
            lambda _agent, _group: healthy,
            marks,
            book,
            tmp_path / notice.NOTICE_FILE,
            lambda _: 5 if met else 4,
        )
        restart = heal_round.restart_or_heal(lambda _agent, g: restarted.append(g), ways)
        started = time.monotonic()
        assert restart(agent, group) is None and restarted == [group] and met == []  # still forming
        assert time.monotonic() - started >= 0.5 and not (tmp_path / notice.GROW_FILE).exists()
        group.workers[0].id = worker.pid
        while marks.starting([worker.pid]):  # its group formed (its mark)
            time.sleep(0.01)
        assert restart(agent, group) is None and restarted == [group] and met == [True]  # healed
        assert (tmp_path / notice.GROW_FILE).read_text().split()[0] == "4"  # the round of their world
        severed = (tmp_path / notice.SEVER_FILE).exists()
        assert severed == (leaves_on == "sever"), severed  # asked only where none left at a boundary
        said = capsys.readouterr().err
        assert "a node waits to join the world; this pod's workers leave their group at the next step" in said
        assert ("no worker left its group at a step boundary" in said) == severed, said
        assert "healed in place into round 5" in said, said
    finally:
        for process in (forming, worker):
            process.kill()
            process.wait()


class _Store:
    """A store of plain keys (the healers' names), as torch's TCPStore answers check and get."""

    def __init__(self, keys: dict[str, bytes]) -> None:
        self.keys = keys

    def check(self, keys: list[str]) -> bool:
        return all(key in self.keys for key in keys)

    def get(self, key: str) -> bytes:
        return self.keys[key]


def _watch(beats: dict[str, float], waiting: set[str], healers: dict[int, str]) -> SimpleNamespace:
    """A round's watch whose read of torch's state holds ``beats`` (each node's keep-alive, seconds ago) and
    ``waiting`` (its wait list), beside the store's named ``healers`` (by round)."""
    import pickle
    from datetime import UTC, datetime, timedelta

    now = datetime.now(UTC)
    state = SimpleNamespace(
        last_heartbeats={node: now - timedelta(seconds=ago) for node, ago in beats.items()}, wait_list=waiting
    )
    keys = {heal_meeting.healers_key("run", round_): names.encode() for round_, names in healers.items()}

    def ask(call: object) -> tuple[bool, object]:
        return True, call()  # type: ignore[operator]

    return SimpleNamespace(
        read_state=lambda: (pickle.dumps(state), None),
        watch=SimpleNamespace(bound=5.0),
        run_id="run",
        store=_Store(keys),
        reading=SimpleNamespace(ask=ask),
    )


def test_the_round_a_heal_meets_counts_the_nodes_alive_those_between_rounds_and_a_joiner() -> None:
    # a, b survivors (b between rounds: its keep-alive taken away, named a healer of round 4); c lost (its
    # keep-alive expired); j waits to join
    watch = _watch({"a": 0.5, "c": 30.0, "j": 1.0}, {"j"}, {4: "b;a;"})
    assert heal_meeting.members_alive(watch, 4) == heal_meeting.Meeting(3, joining=True)
    assert heal_meeting.members_alive(watch, 3) == heal_meeting.Meeting(2, joining=True), "round 3 named none"
    # a shrink: a survivor that joined the wait list first waits there, and it joins no world of its own
    watch = _watch({"a": 0.5, "b": 0.2}, {"b"}, {4: "b;a;"})
    assert heal_meeting.members_alive(watch, 4) == heal_meeting.Meeting(2, joining=False)
    assert heal_meeting.members_alive(None, 4) is None


def test_a_node_joins_a_running_world_where_a_round_is_complete_without_it_and_has_room() -> None:
    """heal_meeting.joining, on torch's own state: the members of a world this node would join (a grow's
    joiner, which waits for its warm workers and polls fast), else 0."""
    import pickle

    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

    me, a, b = (_NodeDesc(f"127.0.0.{i}", i, 0) for i in (9, 1, 2))

    def handler(*members: object, complete: bool = True, max_nodes: int = 3, readable: bool = True) -> object:
        state = _RendezvousState()
        state.complete, state.participants = complete, {node: rank for rank, node in enumerate(members)}

        def get_state() -> tuple[bytes, bytes]:
            if not readable:
                raise RuntimeError("the store does not answer")
            return pickle.dumps(state), b"token"

        holder = SimpleNamespace(_backend=SimpleNamespace(get_state=get_state))
        return SimpleNamespace(
            _this_node=me, _state_holder=holder, _settings=SimpleNamespace(max_nodes=max_nodes)
        )

    assert heal_meeting.joining(handler(a, b)) == 2  # a world of 2 trains, room for a third
    assert heal_meeting.joining(handler(me, a)) == 0  # a member of it (a restart's round)
    assert heal_meeting.joining(handler(a, b, complete=False)) == 0  # a round forming: every node starts
    assert heal_meeting.joining(handler(a, b, max_nodes=2)) == 0  # no room: a spare, waiting as torch's
    assert heal_meeting.joining(handler(a, b, readable=False)) == 0
