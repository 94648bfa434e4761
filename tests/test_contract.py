"""The operator's side and the trainer's side of the pod contract agree (they ship as two images)."""

from __future__ import annotations

from pathlib import Path

from ddp_operator import policy, render
from ddp_operator.spec import parse_file
from ddp_trainer import exitcodes
from ddp_trainer.config import parse_args

REPO = Path(__file__).resolve().parents[1]


def test_divergence_exit_code_is_shared() -> None:
    assert policy.DIVERGENCE_EXIT_CODE == exitcodes.DIVERGENCE_EXIT_CODE


def test_rendered_trainer_flags_are_the_trainers() -> None:
    (spec,) = parse_file(REPO / "examples" / "multinode-gpu.yaml")
    config = parse_args(render.trainer_args(spec))
    t = spec.trainer
    assert (config.device, config.backend) == ("cuda", "nccl")
    assert (config.seed, config.steps, config.batch_size) == (t.seed, t.steps, t.batch_size)
    assert (config.learning_rate, config.grad_accumulation) == (t.learning_rate, t.grad_accumulation)
    assert (config.checkpoint_every, config.checkpoint_dir) == (t.checkpoint_every, "/checkpoints")
    assert (config.sync_every, config.on_divergence) == (spec.sync_check.every_steps, "Fail")
    assert config.timeout_seconds == spec.nccl.timeout_seconds
    assert config.model == t.model
