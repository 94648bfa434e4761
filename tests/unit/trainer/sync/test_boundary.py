"""The step boundary (:mod:`ddp_trainer.sync.boundary`): when checks and checkpoints are due, the fire drill,
the skew ratio, the stop flag and its agreement (a gloo group of one here; three ranks in the ``slow``
multi-process tests)."""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import Iterator

import pytest
import torch

from ddp_trainer.core.config import ChaosSpec, TrainerConfig
from ddp_trainer.sync.boundary import (
    CHAOS_NUDGE,
    Due,
    StopRequest,
    check_due,
    drill_fires,
    due_at,
    nudge,
    skew_ratio,
)
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


def test_one_rule_says_when_a_check_is_due() -> None:
    """:func:`check_due`, as SyncHealth.step uses it (no stop, no save): every ``every`` steps, at the
    total (and past it), before a probe; no total: periodic only."""
    due = {step: check_due(step, 3, 7) for step in range(1, 10)}
    assert due == {
        1: None,
        2: None,
        3: "periodic",
        4: None,
        5: None,
        6: "periodic",
        7: "final",
        8: "final",
        9: "final",  # past the total: still final (final wins over periodic)
    }
    assert [s for s in range(1, 10) if check_due(s, 3, None)] == [3, 6, 9]
    assert check_due(9, 3, None) == "periodic"
    assert check_due(4, 3, None, probe=True) == "periodic"  # the probe needs just-verified parameters
    assert check_due(7, 3, 7, probe=True) == "final"
    assert check_due(4, 3, 20, save=True) == "periodic" and check_due(4, 3, 20, stop=True) == "final"


def test_both_callers_check_when_they_did_before_the_rule_was_shared() -> None:
    """The two rules the shared one replaced, written out: the trainer's (a check when saving, stopping,
    at the end or every ``sync_every``; a probe needs one too) and SyncHealth.step's (at the total, every
    ``every``, or for a probe)."""
    config = TrainerConfig(steps=20, sync_every=3, checkpoint_every=4)
    for step, saving, stop, probe in itertools.product(range(1, 24), *[(False, True)] * 3):
        save = saving and (step % 4 == 0 or stop)
        final = step >= 20
        before = "final" if final or stop else "periodic"
        wanted = before if save or stop or final or step % 3 == 0 or probe else None
        assert due_at(step, config, saving=saving, stop=stop, probe=probe) == Due(wanted, save), step
    for step, total, probe in itertools.product(range(1, 24), (None, 1, 20), (False, True)):
        final = total is not None and step >= total
        wanted = ("final" if final else "periodic") if final or step % 3 == 0 or probe else None
        assert check_due(step, 3, total, probe=probe) == wanted, (step, total, probe)


def test_a_probe_makes_the_trainer_check_without_saving() -> None:
    config = TrainerConfig(steps=20, sync_every=3, checkpoint_every=4)
    assert due_at(5, config, saving=True, stop=False, probe=True) == Due("periodic", False)
    assert due_at(5, config, saving=True, stop=False) == Due(None, False)


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


@pytest.mark.parametrize(
    ("flags", "agreed"),
    [
        ([(False, False), (False, False)], (False, False)),
        ([(False, True), (False, False)], (False, True)),  # one rank's launcher asked: every rank grows
        ([(False, True), (True, False)], (True, False)),  # a stop outranks a grow
        ([(True, True), (False, False)], (True, False)),
    ],
)
def test_the_boundarys_agreement_grows_where_a_rank_asked_and_none_stops(
    flags: list[tuple[bool, bool]], agreed: tuple[bool, bool]
) -> None:
    """The flag each rank sends (:func:`flag_of`) reduced with MAX, as the collective does, read back: a
    grow where any rank asked and none stops."""
    from ddp_trainer.sync.boundary import GROW, STOP, flag_of

    reduced = max(flag_of(stop, grow) for stop, grow in flags)
    assert (reduced >= STOP, reduced == GROW) == agreed


def test_the_agreement_on_a_real_group_returns_the_stop_and_the_grow() -> None:
    """:class:`StopAgreement` on a gloo group of one: its call says the stop, its ``agree`` the pair."""
    import torch.distributed as dist

    from ddp_trainer.sync.boundary import StopAgreement

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]
    try:
        agreement = StopAgreement()
        assert agreement.agree(False, True) == (False, True)
        assert agreement.agree(True, True) == (True, False)
        assert agreement(True) is True and agreement(False) is False
    finally:
        dist.destroy_process_group()
