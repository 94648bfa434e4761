"""The launcher's side of a heal (launch/heal_round.py), without torch's agent: when it is armed, what the
workers' marks say, the notice of the world torch assigned (the heal itself with real processes:
tests/integration/trainer/test_heal_multiprocess.py plays the launchers)."""

from __future__ import annotations

from types import SimpleNamespace

from ddp_trainer.core import notice
from ddp_trainer.launch import heal_round

WANTED = notice.read_note(notice.HEAL_WANTED)
HEALED = notice.read_note(notice.healed_note(4, {"step": 10}))
FAILED = notice.read_note(notice.heal_failed_note(4, "the store never came"))


def test_a_heal_is_armed_for_an_elastic_job_of_the_built_in_trainer_that_asks() -> None:
    on = {heal_round.HEAL_ENV: "1"}
    assert heal_round.armed(on, builtin=True, elastic=True)
    assert not heal_round.armed({}, builtin=True, elastic=True)  # until proven under ddpjob local: asked for
    assert not heal_round.armed({heal_round.HEAL_ENV: "0"}, builtin=True, elastic=True)
    assert not heal_round.armed(on, builtin=False, elastic=True)  # a user's script: not yet
    assert not heal_round.armed(on, builtin=True, elastic=False)  # a rigid job has no smaller world


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
