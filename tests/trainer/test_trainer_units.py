"""Pure parts of the trainer: config, environment, report, checkpoint files, data order, metrics."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from prometheus_client import CollectorRegistry

from ddp_trainer import checkpoint, config, report
from ddp_trainer.contract import DIVERGENCE_EXIT_CODE
from ddp_trainer.data import micro_batches, synthetic
from ddp_trainer.distributed import read_launch_env
from ddp_trainer.loop import Precision
from ddp_trainer.metrics import TrainerMetrics
from ddp_trainer.model import MLP
from ddp_trainer.state import TrainState

CONTRACT = [
    "--device=cpu",
    "--backend=gloo",
    "--seed=5",
    "--steps=20",
    "--batch-size=8",
    "--learning-rate=0.5",
    "--grad-accumulation=2",
    "--checkpoint-every=4",
    "--checkpoint-dir=/ckpt",
    "--model=pkg.mod:build",
    "--sync-every=3",
    "--on-divergence=Repair",
    "--timeout-seconds=60",
]


def test_the_operator_contract_parses() -> None:
    cfg = config.parse_args(CONTRACT)
    assert cfg == config.TrainerConfig(
        device="cpu",
        backend="gloo",
        seed=5,
        steps=20,
        batch_size=8,
        learning_rate=0.5,
        grad_accumulation=2,
        checkpoint_every=4,
        checkpoint_dir="/ckpt",
        model="pkg.mod:build",
        sync_every=3,
        on_divergence="Repair",
        timeout_seconds=60,
    )
    assert DIVERGENCE_EXIT_CODE == 86


def test_defaults_run_alone_and_policies_are_case_insensitive() -> None:
    cfg = config.parse_args([])
    assert (cfg.model, cfg.on_divergence, cfg.checkpoint_every, cfg.grad_accumulation) == (
        "mlp",
        "Fail",
        0,
        1,
    )
    assert cfg.resolved_device(False) == "cpu" and cfg.resolved_backend("cpu") == "gloo"
    assert cfg.resolved_backend("cuda") == "nccl" and cfg.resolved_precision("cuda") == "bf16"
    assert config.parse_args(["--on-divergence=warn"]).on_divergence == "Warn"


@pytest.mark.parametrize("bad", ["--steps=0", "--on-divergence=Ignore", "--learning-rate=-1", "--device=tpu"])
def test_bad_arguments_are_refused_naming_the_flag(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        config.parse_args([bad])
    assert bad.split("=")[0] in capsys.readouterr().err


def test_every_config_field_is_documented() -> None:
    docs = config.field_docs(config.TrainerConfig)
    assert set(docs) == {f.name for f in dataclasses.fields(config.TrainerConfig)}
    assert all(len(text) > 10 for text in docs.values())


def test_pod_and_launcher_environment() -> None:
    env = {"DDPJOB_NAME": "j", "DDPJOB_NAMESPACE": "n", "DDPJOB_ATTEMPT": "2", "DDPJOB_METRICS_PORT": "9500"}
    env |= {"DDPJOB_TERMINATION_LOG": "/t", "DDPJOB_CHAOS_DIVERGE": "rank=3, step=50"}
    pod = config.read_pod_env(env)
    assert pod == config.PodEnv("j", "n", 2, 9500, "/t", config.ChaosSpec(rank=3, step=50))
    with pytest.raises(ValueError, match="DDPJOB_CHAOS_DIVERGE"):
        config.parse_chaos("rank=1")
    launch = read_launch_env({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "GROUP_RANK": "2"})
    assert (launch.rank, launch.local_rank, launch.world_size, launch.node_rank, launch.launched) == (
        5,
        1,
        8,
        2,
        True,
    )
    assert not read_launch_env({}).launched


def test_termination_message_fits_the_kubernetes_limit() -> None:
    big = {
        "result": "Diverged",
        "message": "x" * 10_000,
        "mismatchedTensors": [f"layer.{i}.w" * 9 for i in range(999)],
    }
    text = report.termination_message(big | {"maxAbsDiff": float("inf")})
    data = json.loads(text)
    assert len(text.encode()) < 4096
    assert data["result"] == "Diverged" and data["mismatchedTensors"] and data["maxAbsDiff"] == "inf"


def test_checkpoints_are_atomic_pruned_and_restore_model_and_optimizer(tmp_path: Path) -> None:
    (tmp_path / ".step-00000009.pt.tmp-1").write_bytes(b"partial")  # a crash mid-save
    (tmp_path / "notes.txt").write_text("ignored")
    model = MLP()
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 32)).sum().backward()
    optimizer.step()
    state = TrainState(model, optimizer, Precision.of(torch.device("cpu"), "fp32").scaler(), step=0, epoch=1)
    for step in (4, 8, 12):
        state.step = step
        checkpoint.save(tmp_path, state, {"world_size": 2})
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [8, 12]
    assert not list(tmp_path.glob(".step-*12*"))
    fresh = TrainState(MLP(), torch.optim.AdamW(MLP().parameters()), state.scaler)
    fresh.optimizer = torch.optim.AdamW(fresh.model.parameters())
    checkpoint.load_into(fresh, checkpoint.checkpoint_path(tmp_path, 12).read_bytes(), torch.device("cpu"))
    assert (fresh.step, fresh.epoch) == (12, 1)
    for a, b in zip(model.state_dict().values(), fresh.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    moments = [s["exp_avg"] for s in fresh.optimizer.state.values()]
    assert moments and all(
        torch.equal(x, y["exp_avg"]) for x, y in zip(moments, optimizer.state.values(), strict=True)
    )


def test_resuming_the_data_skips_exactly_what_was_consumed() -> None:
    data = synthetic(config.TrainerConfig(seed=1))
    kwargs = {"batch_size": 64, "rank": 1, "world_size": 4, "seed": 1}
    straight = micro_batches(data, **kwargs)
    seen = [next(straight) for _ in range(40)]  # crosses into epoch 1 (2048 / 64 = 32 per epoch)
    resumed = micro_batches(data, skip=30, **kwargs)
    for (e1, x1, y1), (e2, x2, y2) in zip(seen[30:], resumed, strict=False):
        assert e1 == e2 and torch.equal(x1, x2) and torch.equal(y1, y2)
    assert seen[35][0] == 1 and not torch.equal(seen[0][1], seen[32][1])  # set_epoch reshuffles
    other = next(micro_batches(data, **(kwargs | {"rank": 2})))
    assert not torch.equal(other[1], seen[0][1])  # each rank its own shard


def test_metrics_record_values_with_the_rank_labels() -> None:
    registry = CollectorRegistry()
    labels = {"job": "j", "namespace": "n", "rank": "3", "node_rank": "1"}
    metrics = TrainerMetrics(labels, {"world_size": "4"}, registry)
    metrics.observe_step(1, 0.02, 16, 1.5, True, now=100.0)
    metrics.observe_step(2, 0.03, 16, float("nan"), False, now=101.0)
    metrics.observe_check("periodic", False, 0.001, 2, 0.5, now=102.0)
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
    assert value("ddp_sync_last_success_timestamp_seconds", labels) in (None, 0.0)
    assert value("ddp_step", labels) == 2
    assert value("ddp_sync_last_check_timestamp_seconds", labels) == 102.0
    assert value("ddp_sync_last_check_ok", labels) == 0
