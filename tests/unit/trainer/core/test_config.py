"""The command line and the pod environment (:mod:`ddp_trainer.core.config`)."""

from __future__ import annotations

import dataclasses

import pytest

from ddp_trainer.contract import DIVERGENCE_EXIT_CODE
from ddp_trainer.core import config

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
        100,
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


def test_pod_environment() -> None:
    env = {"DDPJOB_NAME": "j", "DDPJOB_NAMESPACE": "n", "DDPJOB_ATTEMPT": "2", "DDPJOB_METRICS_PORT": "9500"}
    env |= {"DDPJOB_TERMINATION_LOG": "/t", "DDPJOB_CHAOS_DIVERGE": "rank=3, step=50", "DDPJOB_UID": "u-1"}
    pod = config.read_pod_env(env)
    chaos = config.ChaosSpec(rank=3, step=50)
    assert pod == config.PodEnv("j", "n", "u-1", 2, 9500, "/t", chaos)
    assert config.read_pod_env({}).uid == ""
    with pytest.raises(ValueError, match="DDPJOB_CHAOS_DIVERGE"):
        config.parse_chaos("rank=1")


def test_the_heal_drill_names_one_rank() -> None:
    assert config.read_pod_env({"DDPJOB_CHAOS_HEAL_NUDGE": " rank = 2 "}).heal_nudge == 2
    assert config.read_pod_env({}).heal_nudge is None and config.parse_rank_drill(" ") is None
    for bad in ("rank=1,step=5", "2", "rank=-1"):
        with pytest.raises(ValueError, match="DDPJOB_CHAOS_HEAL_NUDGE"):
            config.read_pod_env({"DDPJOB_CHAOS_HEAL_NUDGE": bad})


def test_help_opens_with_what_the_trainer_is() -> None:
    text = config.build_parser().format_help()
    description = text.split("\n\n")[1]
    assert description.startswith("The ddpjob trainer:") and "Trainer configuration" not in text
