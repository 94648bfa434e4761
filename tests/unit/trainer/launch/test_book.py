"""The launcher's bookkeeping (launch/book.py): a rendezvous of the same world after a failure is a restart
in place, counted; an elastic job's rendezvous of a smaller or larger world is a resize, not counted, and
the restart torch spent on the failure that led to it is given back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddp_trainer import contract
from ddp_trainer.core import inplace
from ddp_trainer.launch.book import Book


def test_the_world_change_of_each_rendezvous() -> None:
    assert inplace.world_change(0, 3) == inplace.FIRST
    assert inplace.world_change(3, 3) == inplace.SAME
    assert inplace.world_change(3, 2) == inplace.RESIZED
    assert inplace.world_change(2, 3) == inplace.RESIZED


def test_a_failure_then_the_same_world_is_a_restart_in_place(tmp_path: Path) -> None:
    book = Book(tmp_path / "state.json")
    assert book.rendezvoused(2) == (inplace.FIRST, 0)
    book.failed({1: (1, "boom")})
    assert book.rendezvoused(2) == (inplace.SAME, 0)
    state = inplace.read_state({contract.LAUNCH_STATE_ENV: str(tmp_path / "state.json")})
    assert state.restarts == 1 and "boom" in state.cause


def test_a_lost_peer_shrinks_the_world_at_no_cost_and_a_joiner_grows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    book = Book(tmp_path / "state.json", elastic=True)
    book.rendezvoused(3, 0)
    book.failed({2: (1, "connection reset by peer")})  # the survivors' workers lost their peer
    assert book.rendezvoused(2, 1) == (inplace.RESIZED, 1)  # torch's restart given back
    assert book.rendezvoused(3, 2) == (inplace.RESIZED, 0)  # a joiner: torch spent nothing
    assert book.state.restarts == 0 and book.pending is None
    state = inplace.read_state({contract.LAUNCH_STATE_ENV: str(tmp_path / "state.json")})
    rounds = [(c.round, c.reason, c.before, c.after) for c in state.history]  # both, read back from the file
    assert rounds == [(1, contract.RESIZE_LOST, 3, 2), (2, contract.RESIZE_REJOINED, 2, 3)]
    said = capsys.readouterr().err
    assert "the world changed from 3 to 2 node(s) (elastic): no restart spent" in said
    assert "from 2 to 3 node(s)" in said and "(why: NodeLost)" in said and "(why: NodeRejoined)" in said


def test_a_lent_restart_is_not_given_back(tmp_path: Path) -> None:
    book = Book(tmp_path / "state.json", elastic=True)
    book.rendezvoused(2)
    book.failed({0: (1, "peer gone")})
    book.borrowed = True  # the agent had none left and was lent one: a shrink then costs nothing net
    assert book.rendezvoused(1) == (inplace.RESIZED, 0) and not book.borrowed


def test_an_elastic_world_that_meets_again_unchanged_after_a_stop_it_did_not_cause_counts_no_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A grow whose joiner missed the round's last call: this pod's agent stopped its workers for the
    waiting node (torch's own restart for a waiting node: no failure seen, or the workers' stop at the step
    boundary, 143), and the round met at the same size. No restart here; the next round grows."""
    book = Book(tmp_path / "state.json", elastic=True)
    book.rendezvoused(1)
    assert book.rendezvoused(1) == (inplace.UNCHANGED, 0)  # torch restarted for the waiting node
    book.failed({0: (contract.INTERRUPTED_EXIT_CODE, "stopped at the step boundary")}, stopped=True)
    assert book.rendezvoused(1) == (inplace.UNCHANGED, 1)  # torch spent one on the stop: given back
    assert book.rendezvoused(2) == (inplace.RESIZED, 0)  # the joiner, at the next round
    state = inplace.read_state({contract.LAUNCH_STATE_ENV: str(tmp_path / "state.json")})
    assert book.state.restarts == 0 and (state.restarts, state.cause, state.at) == (0, "", 0.0)
    assert (state.resizes, state.resize, state.resize_from, state.resize_to) == (
        1,
        contract.RESIZE_REJOINED,
        1,
        2,
    )
    assert "the world met again at 1 node(s) after a stop this pod did not cause" in capsys.readouterr().err
    book.failed({0: (1, "boom")})  # a failure of its own at the same size is still a restart in place
    assert book.rendezvoused(2) == (inplace.SAME, 0) and book.state.restarts == 1
    # a node dropped as silent that woke: it stopped its stale workers and met the world again at its size
    book.failed(
        {0: (-9, "")}, stopped=True, why="this node was dropped from its round as silent", silent=True
    )
    assert book.rendezvoused(2) == (inplace.UNCHANGED, 1) and book.state.restarts == 1
    said = capsys.readouterr().err
    assert "the world met again at 2 node(s) with this node, which was dropped as silent" in said, said


def test_a_rigid_world_that_meets_again_after_another_nodes_failure_counts_it(tmp_path: Path) -> None:
    book = Book(tmp_path / "state.json")
    book.rendezvoused(2)
    assert book.rendezvoused(2) == (inplace.SAME, 0)
    assert (book.state.restarts, book.state.cause) == (1, inplace.OTHER_NODE)


def test_a_rigid_world_whose_workers_heal_after_another_nodes_crash_counts_no_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``DDPJOB_HEAL=1``, a rigid job: another node's rank crashed and restarted (that node counts it); this
    pod's workers lost a peer and heal in place into the round it meets: no restart here, no resize."""
    book = Book(tmp_path / "state.json")
    book.heals = True
    book.rendezvoused(3)
    book.failed({}, stopped=True, why="a worker lost a peer (its collective failed): healed in place")
    assert book.rendezvoused(3, 1, healing=True) == (inplace.UNCHANGED, 0)
    assert (book.state.restarts, book.state.resizes) == (0, 0)
    assert "the world met again at 3 node(s) this pod's workers heal in place" in capsys.readouterr().err
    book.failed({0: (1, "boom")})  # its own rank's crash: still a restart in place, counted
    assert book.rendezvoused(3, 2) == (inplace.SAME, 0) and book.state.restarts == 1
    said = capsys.readouterr().err  # its fresh workers join the others' heal: not the checkpoint's state
    assert "restarting this pod's workers from the others' state where they heal in place" in said, said
    assert book.state.restart_from == contract.RESTART_FROM_OTHERS  # what the workers report
    plain = Book(tmp_path / "plain.json")  # a launcher that does not heal
    plain.rendezvoused(3)
    plain.failed({0: (1, "boom")})
    plain.rendezvoused(3, 2)
    assert plain.state.restart_from == contract.RESTART_FROM_CHECKPOINT
    assert "restarting this pod's workers from the last checkpoint" in capsys.readouterr().err


def test_each_world_change_is_recorded_with_its_reason_for_the_workers(tmp_path: Path) -> None:
    """A peer's death, a silent peer and a joiner each leave their reason, the nodes before and after, and
    when the earlier world stopped, in the state the workers read (and report); restarts in place keep
    their own count beside them."""
    path = tmp_path / "state.json"
    book = Book(path, elastic=True)
    book.rendezvoused(3)
    book.failed({2: (1, "connection reset by peer")})
    stopped_at = book.pending[1] if book.pending else 0.0
    book.rendezvoused(2)
    state = inplace.read_state({contract.LAUNCH_STATE_ENV: str(path)})
    assert (state.resizes, state.resize, state.resize_from, state.resize_to) == (
        1,
        contract.RESIZE_LOST,
        3,
        2,
    )
    assert state.resize_at == stopped_at
    book.rendezvoused(3)  # a replacement joined
    book.failed({}, stopped=True, why="node(s) pod-2 went silent: no keep-alive for 5.2 s")
    book.rendezvoused(2)
    state = inplace.read_state({contract.LAUNCH_STATE_ENV: str(path)})
    assert (state.resizes, state.resize, state.resize_from, state.resize_to) == (
        3,
        contract.RESIZE_SILENT,
        3,
        2,
    )
    book.failed({0: (1, "boom")})
    book.rendezvoused(2)  # a restart in place keeps the record of the last resize
    state = inplace.read_state({contract.LAUNCH_STATE_ENV: str(path)})
    assert (state.restarts, state.resizes, state.resize) == (1, 3, contract.RESIZE_SILENT)
    book.failed({}, stopped=True)  # a stop at the step boundary, then a smaller world: a node left
    book.rendezvoused(1)
    assert (book.state.resizes, book.state.resize) == (4, contract.RESIZE_LOST)


def test_a_workers_structured_error_is_read_for_its_message() -> None:
    # torch's error file of a worker that failed in init_process_group holds {"message": ..., "extraInfo":
    # ...}: the launcher crashed on it ('dict' object has no attribute 'strip'), found by issue 54's test of
    # rank 0's node lost as the workers of a world of 3 start
    error = {"message": "Traceback (most recent call last):\n  x\nDistNetworkError: closed", "extraInfo": {}}
    assert inplace.cause({2: (1, error)}) == "rank 2 exited 1: DistNetworkError: closed"  # type: ignore[dict-item]


def test_a_heal_books_the_lost_peers_world_change_and_gives_back_no_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    book = Book(tmp_path / "state.json", elastic=True)
    book.rendezvoused(3, 0)
    book.failed(
        {}, stopped=True, why="a worker lost a peer", silent=False
    )  # launch/heal_round.py: no worker ended
    assert book.rendezvoused(2, 1, healing=True) == (inplace.RESIZED, 0)  # torch spent no restart
    assert book.state.restarts == 0 and book.state.history[-1].reason == contract.RESIZE_LOST
    assert "this pod's workers heal in place (why: NodeLost)" in capsys.readouterr().err


def test_a_heal_is_recorded_as_healed_until_it_is_refused_and_an_older_record_reads_as_restarted(
    tmp_path: Path,
) -> None:
    """The world change a heal books says healed, for the workers to report (``ddp_resize_info{mode}``);
    a heal refused (its workers stopped for the restart) says restarted, as does a grow; a launch state an
    older launcher wrote (changes without a mode) reads as restarted."""
    path = tmp_path / "state.json"
    env = {contract.LAUNCH_STATE_ENV: str(path)}
    book = Book(path, elastic=True)
    book.rendezvoused(3, 0)
    book.failed({}, stopped=True, why="a worker lost a peer", silent=False)
    book.rendezvoused(2, 1, healing=True)
    assert [c.mode for c in inplace.read_state(env).history] == [contract.RESIZE_HEALED]
    book.rendezvoused(3, 2)  # a grow: the workers restart
    book.failed({}, stopped=True, why="a worker lost a peer", silent=False)
    book.rendezvoused(2, 3, healing=True)
    book.heal_refused()
    modes = [c.mode for c in inplace.read_state(env).history]
    assert modes == [contract.RESIZE_HEALED, contract.RESIZE_RESTARTED, contract.RESIZE_RESTARTED]
    book.heal_refused()  # nothing healed is left to refuse: unchanged
    assert [c.mode for c in inplace.read_state(env).history] == modes
    older = {"restarts": 0, "cause": "", "at": 0.0, "resizes": 1, "history": [[1, "NodeLost", 3, 2, 5.0]]}
    path.write_text(json.dumps(older))
    assert inplace.read_state(env).history == (
        inplace.Change(1, "NodeLost", 3, 2, 5.0, contract.RESIZE_RESTARTED),
    )


def test_a_failed_heal_is_the_cause_of_the_restart_in_place_that_follows(tmp_path: Path) -> None:
    """launch/heal_round.py stops workers whose heal failed (SIGKILL): the restart is booked with the heal's
    failure, whether the agent sees them ended first or restarts them at once for a waiting node."""
    book = Book(tmp_path / "state.json", elastic=True)
    book.rendezvoused(3, 0)
    book.failed({}, stopped=True, why="a worker lost a peer", silent=False)
    book.rendezvoused(2, 1, healing=True)
    why = "the heal in place failed: the healed world's replica check failed at step 40"
    book.fell_back(why)
    book.failed({0: (-9, "Signal 9 (SIGKILL) received by PID 12")})  # the agent sees them ended
    assert book.rendezvoused(2, 2) == (inplace.SAME, 0)
    assert (book.state.restarts, book.state.cause) == (1, why)
    book.fell_back(why)  # a waiting node's restart: no failure seen
    book.rendezvoused(2, 3)
    assert (book.state.restarts, book.state.cause) == (2, why)
    book.failed({1: (-9, "")})  # the next failure is its own again
    book.rendezvoused(2, 4)
    assert (book.state.restarts, book.state.cause) == (3, "rank 1 killed by signal 9")
