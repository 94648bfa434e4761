"""The heal notice a launcher writes for its workers, and the heal notes of a worker's mark (pure, and the
file's atomic write)."""

from __future__ import annotations

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
