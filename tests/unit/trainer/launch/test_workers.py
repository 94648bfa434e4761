"""What a launcher reads of its workers' marks (launch/workers.py): whether their group formed."""

from __future__ import annotations

from pathlib import Path

from ddp_trainer import contract
from ddp_trainer.core import inplace
from ddp_trainer.launch import workers


def _mark(directory: Path, pid: int, note: str) -> None:
    inplace.mark_worker(
        inplace.worker_mark({contract.LAUNCH_STATE_ENV: str(directory / "launch.json")}, pid), note
    )


def test_workers_that_leave_marks_start_until_one_says_its_group_formed(tmp_path: Path) -> None:
    marks = workers.Marks(tmp_path)
    assert not marks.starting([11, 12])  # a user's script that leaves none: not known to start
    marks.builtin = True
    assert marks.starting([11, 12]) and not marks.starting([])
    _mark(tmp_path, 12, inplace.FORMED)
    assert not marks.starting([11, 12])
    marks.clear()  # a new round: the last one's marks go
    assert not list(tmp_path.glob("worker-*")) and marks.starting([11, 12])
    user = workers.Marks(tmp_path)  # a user's script with SyncHealth: a mark seen once, expected after
    _mark(tmp_path, 13, inplace.FORMED)
    assert not user.starting([13]) and user.reported
    user.clear()
    assert user.starting([14])


def test_a_mark_is_left_beside_the_launch_state_and_nowhere_without_a_launcher(tmp_path: Path) -> None:
    assert inplace.worker_mark({}, 5) is None
    inplace.mark_worker(None, inplace.FORMED)  # nothing, and no error
    inplace.mark_worker(tmp_path / "gone" / "worker-5", inplace.FORMED)  # an unwritable place: no error
    _mark(tmp_path, 5, inplace.FORMED)
    assert (tmp_path / "worker-5").read_text() == inplace.FORMED
    assert not list(tmp_path.glob(".*.tmp"))
