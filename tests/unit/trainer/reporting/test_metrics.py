"""The ``ddp_*`` series (:mod:`ddp_trainer.reporting.metrics`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from ddp_trainer import contract
from ddp_trainer.core.inplace import Change, LaunchState
from ddp_trainer.reporting.metrics import TrainerMetrics


def test_metrics_record_values_with_the_rank_labels() -> None:
    registry = CollectorRegistry()
    labels = {"ddpjob": "j", "ddpjob_namespace": "n", "rank": "3", "node_rank": "1"}
    metrics = TrainerMetrics(labels, {"world_size": "4"}, registry)
    metrics.observe_step(1, 0.02, 16, 1.5, True, now=100.0)
    metrics.observe_step(2, 0.03, 16, float("nan"), False, now=101.0)
    metrics.observe_check("periodic", 120, False, 0.001, 2, 0.5, now=102.0)
    value = registry.get_sample_value
    assert value("ddp_steps_total", labels) == 2 and value("ddp_samples_total", labels) == 32
    assert value("ddp_loss", labels) == 1.5 and value("ddp_nonfinite_loss_steps_total", labels) == 1
    assert value("ddp_step_duration_seconds_count", labels) == 2
    assert value("ddp_sync_checks_total", labels | {"kind": "periodic", "result": "mismatch"}) == 1
    assert (
        value("ddp_sync_mismatched_tensors", labels) == 2
        and value("ddp_sync_max_abs_divergence", labels) == 0.5
    )
    assert value("ddp_last_step_timestamp_seconds", labels) == 101.0
    assert value("ddp_sync_last_check_step", labels) == 120
    assert value("ddp_sync_last_success_timestamp_seconds", labels) in (None, 0.0)
    assert value("ddp_step", labels) == 2
    assert value("ddp_sync_last_check_timestamp_seconds", labels) == 102.0
    assert value("ddp_sync_last_check_ok", labels) == 0


def test_every_check_kind_and_result_exists_at_zero_before_any_check() -> None:
    """A dashboard shows 0 mismatches, not "no data", and ``increase()`` sees the first mismatch."""
    registry = CollectorRegistry()
    labels = {"ddpjob": "j", "ddpjob_namespace": "n", "rank": "0", "node_rank": "0"}
    TrainerMetrics(labels, {}, registry)
    for kind in contract.CHECK_KINDS:
        for result in contract.CHECK_RESULTS:
            sample = labels | {"kind": kind, "result": result}
            assert registry.get_sample_value(contract.counter_sample(contract.SYNC_CHECKS), sample) == 0
    for family in (contract.SYNC_REPAIRS, contract.NONFINITE_LOSS_STEPS, contract.STEPS):
        assert registry.get_sample_value(contract.counter_sample(family), labels) == 0


def test_labels_do_not_collide_with_the_target_labels_prometheus_sets() -> None:
    """With the default ``honor_labels: false`` a scraped ``job``/``namespace``/``instance``/``pod`` would be
    renamed ``exported_*``; the trainer's identity labels are its own."""
    assert not set(contract.METRIC_LABELS) & {"job", "instance", "namespace", "pod", "container", "endpoint"}


def test_a_changed_description_replaces_the_info_series() -> None:
    """After a fingerprint kernel falls back, ``ddp_info`` names the one in use (the old series reads 0)."""
    registry = CollectorRegistry()
    labels = {"ddpjob": "j", "ddpjob_namespace": "n", "rank": "0", "node_rank": "0"}
    metrics = TrainerMetrics(labels, {"device": "cuda", "fingerprint": "triton"}, registry)
    before, after = labels | {"device": "cuda", "fingerprint": "triton"}, labels | {"device": "cuda"}
    assert registry.get_sample_value(contract.INFO, before) == 1
    metrics.describe(fingerprint="triton")  # unchanged: nothing new
    assert registry.get_sample_value(contract.INFO, after | {"fingerprint": "torch"}) is None
    metrics.describe(fingerprint="torch")
    assert registry.get_sample_value(contract.INFO, before) == 0
    assert registry.get_sample_value(contract.INFO, after | {"fingerprint": "torch"}) == 1
    assert metrics.info == {"device": "cuda", "fingerprint": "torch"}


def test_every_world_change_is_shown_with_its_round_reason_mode_and_the_seconds_the_last_cost() -> None:
    labels = {"ddpjob": "j", "ddpjob_namespace": "ns", "rank": "0", "node_rank": "0"}
    registry = CollectorRegistry()
    metrics = TrainerMetrics(labels, {}, registry)
    metrics.resized(LaunchState(), 1000.0)  # no change yet: nothing said
    assert registry.get_sample_value(contract.ELASTIC_RESIZES, labels) == 0
    history = (
        Change(4, contract.RESIZE_LOST, 3, 2, 900.0),
        Change(7, contract.RESIZE_SILENT, 3, 2, 990.0, contract.RESIZE_HEALED),
    )
    state = LaunchState(
        resizes=2, resize=contract.RESIZE_SILENT, resize_from=3, resize_to=2, resize_at=990.0, history=history
    )
    metrics.resized(state, 1002.5)
    assert registry.get_sample_value(contract.ELASTIC_RESIZES, labels) == 2
    for change in history:  # the earlier one too: a reader that missed its world still counts it
        info = labels | {
            "reason": change.reason,
            "from_nodes": str(change.before),
            "to_nodes": str(change.after),
            "round": str(change.round),
            "mode": change.mode,
        }
        assert registry.get_sample_value(contract.RESIZE_INFO, info) == change.at
    assert registry.get_sample_value(contract.LAST_RESIZE_SECONDS_LOST, labels) == 12.5


def test_a_healed_world_says_its_steps_lost_and_bytes_sent_and_a_restarted_one_says_none() -> None:
    labels = {"ddpjob": "j", "ddpjob_namespace": "ns", "rank": "1", "node_rank": "1"}
    registry = CollectorRegistry()
    metrics = TrainerMetrics(labels, {}, registry)
    assert registry.get_sample_value(contract.LAST_RESIZE_STEPS_LOST, labels) is None  # absent, not 0
    assert registry.get_sample_value(contract.LAST_RESIZE_BYTES_SENT, labels) is None
    metrics.healed(0, 82992)
    assert registry.get_sample_value(contract.LAST_RESIZE_STEPS_LOST, labels) == 0
    assert registry.get_sample_value(contract.LAST_RESIZE_BYTES_SENT, labels) == 82992
