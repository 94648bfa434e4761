"""Verification's policy and tally (:mod:`ddp_trainer.sync.checking`) driven by made-up sync reports: no
process group. The real collective check runs in the ``slow`` multi-process tests."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import torch
from prometheus_client import CollectorRegistry

from ddp_trainer import sync
from ddp_trainer.core.state import TrainState
from ddp_trainer.reporting.metrics import TrainerMetrics
from ddp_trainer.sync.checking import DivergenceError, Tally, Verifier, control_state
from ddp_trainer.train.loop import Precision
from ddp_trainer.train.model import MLP

LABELS = {"ddpjob": "j", "ddpjob_namespace": "n", "rank": "0", "node_rank": "0"}
OK = sync.SyncReport(in_sync=True, checked=12)
DIVERGED = sync.SyncReport(
    in_sync=False,
    checked=12,
    mismatches=(
        sync.TensorMismatch("net.0.weight", (1,), 0, 0.25),
        sync.TensorMismatch("net.1.running_mean", (1, 3), 0, 0.5),
    ),
)


def make_state(step: int = 7) -> TrainState:
    model = MLP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    return TrainState(model, optimizer, Precision.of(torch.device("cpu"), "fp32").scaler(), step=step)


class Script:
    """Fake collectives: ``check`` answers the given reports in order; ``repair`` counts its calls."""

    def __init__(self, reports: Iterable[sync.SyncReport]) -> None:
        self.reports = iter(reports)
        self.repairs = 0

    def check(self, state: TrainState) -> sync.SyncReport:
        return next(self.reports)

    def repair(self, state: TrainState) -> None:
        self.repairs += 1


def verifier(policy: str, reports: Iterable[sync.SyncReport]) -> tuple[Verifier, Script, CollectorRegistry]:
    script, registry = Script(reports), CollectorRegistry()
    metrics = TrainerMetrics(LABELS, {}, registry)
    return Verifier(policy, metrics, check=script.check, repair=script.repair), script, registry  # type: ignore[arg-type]


def checks(registry: CollectorRegistry, kind: str, result: str) -> float | None:
    return registry.get_sample_value("ddp_sync_checks_total", LABELS | {"kind": kind, "result": result})


def test_fail_raises_a_sync_divergence_and_tallies_it() -> None:
    v, script, registry = verifier("Fail", [OK, DIVERGED])
    state = make_state()
    assert v.verify(state, "initial").in_sync
    state.step = 10
    with pytest.raises(DivergenceError) as caught:
        v.verify(state, "periodic")
    assert caught.value.reason == "SyncDivergence" and caught.value.report is DIVERGED
    assert "2 tensor(s) differ between ranks: net.0.weight, net.1.running_mean" in str(caught.value)
    assert "diverged rank(s): 1, 3" in str(caught.value), str(caught.value)
    assert (v.tally.checks, v.tally.mismatches, v.tally.repairs, v.tally.last_check_step) == (2, 1, 0, 10)
    assert v.tally.mismatched_tensors == ["net.0.weight", "net.1.running_mean"]
    assert (v.tally.diverged_ranks, v.tally.max_abs_diff) == ([1, 3], 0.5)
    assert not v.tally.verified and script.repairs == 0
    assert checks(registry, "initial", "ok") == 1 and checks(registry, "periodic", "mismatch") == 1
    assert registry.get_sample_value("ddp_sync_mismatched_tensors", LABELS) == 2
    assert registry.get_sample_value("ddp_sync_last_check_ok", LABELS) == 0


def test_repair_rebroadcasts_checks_again_and_counts_the_repair() -> None:
    v, script, registry = verifier("Repair", [DIVERGED, OK])
    report = v.verify(make_state(), "periodic")
    assert report.in_sync and script.repairs == 1
    assert (v.tally.checks, v.tally.mismatches, v.tally.repairs, v.tally.last_check_ok) == (2, 1, 1, True)
    assert v.tally.verified  # every divergence found was repaired and the last check passed
    assert v.tally.mismatched_tensors == ["net.0.weight", "net.1.running_mean"]  # what was repaired
    assert checks(registry, "periodic", "mismatch") == 1 and checks(registry, "repair", "ok") == 1
    assert registry.get_sample_value("ddp_sync_repairs_total", LABELS) == 1


def test_a_repair_that_does_not_take_raises_repair_failed() -> None:
    v, script, registry = verifier("Repair", [DIVERGED, DIVERGED])
    with pytest.raises(DivergenceError) as caught:
        v.verify(make_state(), "final")
    assert caught.value.reason == "RepairFailed" and script.repairs == 1
    assert (v.tally.checks, v.tally.mismatches, v.tally.repairs) == (2, 2, 0) and not v.tally.verified
    assert checks(registry, "repair", "mismatch") == 1
    assert registry.get_sample_value("ddp_sync_repairs_total", LABELS) == 0


def test_warn_counts_the_divergence_and_goes_on() -> None:
    v, script, _ = verifier("Warn", [DIVERGED, OK, OK])
    state = make_state()
    assert not v.verify(state, "periodic").in_sync
    assert v.verify(state, "periodic").in_sync and v.verify(state, "final").in_sync
    assert (v.tally.checks, v.tally.mismatches, v.tally.repairs, v.tally.last_check_ok) == (3, 1, 0, True)
    assert not v.tally.verified and script.repairs == 0  # passing later does not undo an ignored divergence


def test_a_verifier_without_metrics_still_tallies() -> None:
    script = Script([OK])
    v = Verifier("Fail", check=script.check, repair=script.repair)
    v.verify(make_state(step=3), "initial")
    assert (v.tally.checks, v.tally.last_check_step, v.tally.verified) == (1, 3, True)


@pytest.mark.parametrize(
    ("tally", "verified"),
    [
        (Tally(), False),  # no check ran
        (Tally(checks=3, last_check_ok=True), True),
        (Tally(checks=3, mismatches=1, repairs=1, last_check_ok=True), True),
        (Tally(checks=3, mismatches=1, last_check_ok=True), False),  # ignored (Warn)
        (Tally(checks=3, last_check_ok=False), False),
    ],
)
def test_verified_means_every_divergence_repaired_and_the_last_check_passed(
    tally: Tally, verified: bool
) -> None:
    assert tally.verified is verified


def test_the_control_state_is_checked_beside_the_model() -> None:
    state = make_state(step=5)
    state.epoch = 2
    state.model(torch.randn(4, 32)).sum().backward()
    state.optimizer.step()
    extras = control_state(state)
    assert (extras["control.step"], extras["control.epoch"], extras["control.loss_scale"]) == (5, 2, 1.0)
    assert extras["control.lr.0"] == 0.01
    tensors = [k for k, v in extras.items() if isinstance(v, torch.Tensor)]
    assert tensors and all(not k.startswith("control.") for k in tensors)  # the optimizer's moments
