"""The step boundary (:mod:`ddp_trainer.sync.boundary`): when checks and checkpoints are due, the fire drill,
the skew ratio, the stop flag. The two collectives run in the ``slow`` multi-process tests."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
import torch

from ddp_trainer.core.config import ChaosSpec, TrainerConfig
from ddp_trainer.sync.boundary import CHAOS_NUDGE, Due, StopRequest, drill_fires, due_at, nudge, skew_ratio
from ddp_trainer.train.model import MLP


def schedule(step: int, *, saving: bool = True, stop: bool = False, checkpoint_every: int = 4) -> Due:
    config = TrainerConfig(steps=20, sync_every=3, checkpoint_every=checkpoint_every)
    return due_at(step, config, saving=saving, stop=stop)


@pytest.mark.parametrize(
    ("step", "due"),
    [
        (1, Due(None, False)),
        (3, Due("periodic", False)),  # every --sync-every steps
        (4, Due("periodic", True)),  # before every checkpoint
        (12, Due("periodic", True)),  # both at once: one check
        (20, Due("final", True)),  # the last step
        (21, Due("final", False)),  # past the last (resumed): still final
    ],
)
def test_checks_every_n_steps_before_checkpoints_and_at_the_end(step: int, due: Due) -> None:
    assert schedule(step) == due


def test_stopping_checks_and_saves_at_once() -> None:
    assert schedule(5, stop=True) == Due("final", True)
    assert schedule(5, stop=True, saving=False) == Due("final", False)  # no --checkpoint-dir: nothing to save
    assert schedule(5, stop=True, checkpoint_every=0) == Due(
        "final", True
    )  # SIGTERM saves without a schedule


def test_no_checkpoint_dir_or_schedule_saves_nothing() -> None:
    assert schedule(4, saving=False) == Due(None, False)
    assert schedule(8, checkpoint_every=0) == Due(None, False)
    assert schedule(20, checkpoint_every=0) == Due("final", False)


def test_the_fire_drill_fires_on_its_rank_at_its_step_only() -> None:
    chaos = ChaosSpec(rank=1, step=15)
    assert drill_fires(chaos, 1, 15)
    assert not drill_fires(chaos, 0, 15) and not drill_fires(chaos, 1, 14) and not drill_fires(None, 1, 15)


def test_the_nudge_moves_one_element_of_the_first_parameter() -> None:
    model = MLP()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    name = nudge(model)
    after = model.state_dict()
    assert name == "net.0.weight"
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed == [name]
    diff = (after[name] - before[name]).flatten()
    assert diff[0].item() == pytest.approx(CHAOS_NUDGE, rel=1e-3) and not diff[1:].any()


def test_skew_is_the_slowest_ranks_lead_over_the_fastest() -> None:
    assert skew_ratio(0.2, 0.15) == pytest.approx(0.25)
    assert skew_ratio(0.1, 0.1) == 0.0 and skew_ratio(0.0, 0.0) == 0.0


@pytest.fixture
def restore_signals() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.mark.usefixtures("restore_signals")
def test_sigterm_only_sets_the_stop_flag() -> None:
    stop = StopRequest()
    stop.install()
    assert not stop.requested
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.requested
