"""The heal notice a launcher writes for its workers, and the heal notes of a worker's mark (pure, and the
file's atomic write)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ddp_trainer.core import notice
from ddp_trainer.core.notice import Notice

NOTICE = Notice(4, {0: 2, 1: 3}, 4, 1, 2, "pod-0.job", 29511, "heal-wanted", 1700000000.5)


def test_a_notice_lies_beside_the_launch_state_and_not_without_a_launcher(tmp_path: Path) -> None:
    env = {"DDPJOB_LAUNCH_STATE": str(tmp_path / "launch-state.json")}
    assert notice.notice_path(env) == tmp_path / notice.NOTICE_FILE
    assert notice.notice_path({}) is None


def test_a_notice_written_is_read_back_whole(tmp_path: Path) -> None:
    path = tmp_path / notice.NOTICE_FILE
    assert notice.read_notice(path) is None
    notice.write_notice(path, NOTICE)
    assert notice.read_notice(path) == NOTICE
    assert [p.name for p in tmp_path.iterdir()] == [notice.NOTICE_FILE]  # no temporary file left


@pytest.mark.parametrize("text", ["", "{", "[]", '{"round": 1}', '{"round": "x", "ranks": {}}'])
def test_what_is_no_notice_reads_as_none(tmp_path: Path, text: str) -> None:
    path = tmp_path / notice.NOTICE_FILE
    path.write_text(text)
    assert notice.read_notice(path) is None
    assert notice.read_notice(None) is None


def test_a_worker_takes_its_rank_and_the_launcher_variables_of_the_new_world() -> None:
    assert NOTICE.rank_of(1) == 3
    assert NOTICE.env(0) == {
        "RANK": "2",
        "WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_RANK": "2",
        "ROLE_WORLD_SIZE": "4",
        "MASTER_ADDR": "pod-0.job",
        "MASTER_PORT": "29511",
    }
    assert set(NOTICE.env(0)) == {*notice.WORLD_ENV, "MASTER_ADDR", "MASTER_PORT"}
    with pytest.raises(ValueError, match="local rank 2"):
        NOTICE.rank_of(2)


def test_the_heal_notes_read_back() -> None:
    assert notice.read_note(notice.HEAL_WANTED) == notice.Note(notice.HEAL_WANTED)
    healed = notice.read_note(notice.healed_note(3, {"step": 10, "lost": 1}))
    assert healed == notice.Note(notice.HEALED, 3, {"lost": 1, "step": 10})
    failed = notice.read_note(notice.heal_failed_note(3, "the store\nnever came"))
    assert failed == notice.Note(notice.HEAL_FAILED, 3, why="the store never came")
    assert notice.read_note("formed") is None
    assert notice.read_note("healed x {}") is None
    assert notice.read_note("healed 2 [1]") is None


def _until(ready: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    return ready()


def test_a_worker_severs_once_per_request_of_its_world_and_not_for_an_earlier_one(tmp_path: Path) -> None:
    """The launcher's sever request (a member of the round went silent): the worker's watch acts once per
    new request of its world's round or a later one, including one written before the watch began (its
    group had just formed), never for an earlier world's; a fresh start takes the old request away."""
    path = tmp_path / notice.NOTICE_FILE
    current = [3]
    severed: list[int] = []
    notice.request_sever(path, 3)  # written before the watch began: this world's
    watch = notice.SeverWatch(path, lambda: severed.append(current[0]), lambda: current[0], poll=0.01)
    assert _until(lambda: severed == [3]), severed
    time.sleep(0.05)
    assert severed == [3] and watch.severed == 1  # once per request
    current[0] = 5  # healed into round 5
    notice.request_sever(path, 4)  # the world before the heal's: not this one's
    time.sleep(0.1)
    assert severed == [3]
    notice.request_sever(path, 5)
    assert _until(lambda: severed == [3, 5]), severed
    notice.clear_sever(path)
    notice.clear_sever(path)  # none left: nothing to take away
    assert not (tmp_path / notice.SEVER_FILE).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no temporary file left


def test_a_grow_request_is_for_the_world_it_was_written_in_and_a_fresh_start_takes_it_away(
    tmp_path: Path,
) -> None:
    """The launcher's grow request (a node waits to join): the workers whose world is the request's round,
    or an earlier one, read it at their step boundary; a world healed past it (into a later round) does not;
    a fresh start takes it away with the sever request."""
    path = tmp_path / notice.NOTICE_FILE
    assert notice.grow_round(path) is None and notice.grow_round(None) is None
    notice.request_grow(path, 4)
    assert notice.grow_round(path) == 4
    current = [3]
    watch = notice.SeverWatch(path, lambda: None, lambda: current[0], poll=0.01)
    assert watch.grow_requested(), (
        "a request there when the watch begins is read at once (an earlier world's)"
    )
    current[0] = 4
    assert watch.grow_requested()  # the request's own round
    current[0] = 5
    assert not watch.grow_requested()  # healed into round 5: the request was the world before
    notice.request_grow(path, 5)
    assert _until(watch.grow_requested), "a new request is read by the watch's thread"
    notice.request_sever(path, 4)
    notice.clear_sever(path)
    assert notice.grow_round(path) is None and sorted(p.name for p in tmp_path.iterdir()) == []
    assert _until(lambda: not watch.grow_requested()), "taken away: the watch reads none"
