"""The training loop (:mod:`ddp_trainer.train.loop`) on a plain module: one process, no process group."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from ddp_trainer.core.state import TrainState
from ddp_trainer.train.loop import Batches, Precision, StepResult, train

CPU = torch.device("cpu")


def batches(size: int, count: int = 100, seed: int = 0) -> Batches:
    """``count`` micro-batches of ``size`` points, epoch = index // 10."""
    gen = torch.Generator().manual_seed(seed)
    for i in range(count):
        yield i // 10, torch.randn(size, 4, generator=gen), torch.randn(size, 1, generator=gen)


def linear_state(seed: int = 0) -> TrainState:
    torch.manual_seed(seed)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return TrainState(model, optimizer, Precision.of(CPU, "fp32").scaler())


def collect(into: list[StepResult]) -> Callable[[StepResult], bool]:
    """An ``on_step`` that keeps every result and always goes on."""

    def on_step(result: StepResult) -> bool:
        into.append(result)
        return True

    return on_step


def mse(model: nn.Module, outputs: Any, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(outputs, targets)


def test_the_loop_trains_with_the_loss_function_it_is_given() -> None:
    state = linear_state()
    calls: list[tuple[nn.Module, tuple[int, ...]]] = []

    def loss_fn(model: nn.Module, outputs: Any, targets: torch.Tensor) -> torch.Tensor:
        calls.append((model, tuple(outputs.shape)))
        return mse(model, outputs, targets)

    results: list[StepResult] = []
    train(
        state,
        batches(8),
        total_steps=5,
        grad_accumulation=3,
        precision=Precision.of(CPU, "fp32"),
        device=CPU,
        loss_fn=loss_fn,
        on_step=collect(results),
    )
    assert len(calls) == 15 and all(m is state.model and shape == (8, 1) for m, shape in calls)
    assert [r.step for r in results] == [1, 2, 3, 4, 5] and state.step == 5
    assert all(r.samples == 24 and r.finite and r.loss > 0 and r.duration_seconds >= 0 for r in results)
    assert [r.epoch for r in results] == [0, 0, 0, 1, 1] and state.epoch == 1  # epoch of the last micro-batch


def test_accumulated_micro_batches_make_the_same_step_as_one_batch() -> None:
    split, whole = linear_state(), linear_state()
    data = list(batches(4, count=2))
    joined = iter([(0, torch.cat([data[0][1], data[1][1]]), torch.cat([data[0][2], data[1][2]]))])
    common = {"precision": Precision.of(CPU, "fp32"), "device": CPU, "loss_fn": mse, "total_steps": 1}
    seen: list[StepResult] = []
    train(split, iter(data), grad_accumulation=2, on_step=collect(seen), **common)
    train(whole, joined, grad_accumulation=1, on_step=collect(seen), **common)
    for a, b in zip(split.model.parameters(), whole.model.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    assert seen[0].loss == pytest.approx(seen[1].loss)  # the step's loss is the mean over micro-batches


def test_on_step_stops_the_loop_and_a_resumed_state_counts_on() -> None:
    state = linear_state()
    state.step = 10  # resumed from a step-10 checkpoint
    steps: list[int] = []

    def on_step(result: StepResult) -> bool:
        steps.append(result.step)
        return result.step < 12

    kwargs: dict[str, Any] = {"precision": Precision.of(CPU, "fp32"), "device": CPU, "loss_fn": mse}
    train(state, batches(2), total_steps=20, grad_accumulation=1, on_step=on_step, **kwargs)
    assert steps == [11, 12] and state.step == 12
    train(state, batches(2), total_steps=12, grad_accumulation=1, on_step=on_step, **kwargs)
    assert steps == [11, 12]  # already at total_steps: no step runs


def test_a_non_finite_loss_is_reported_as_such() -> None:
    def nan_loss(model: nn.Module, outputs: Any, targets: torch.Tensor) -> torch.Tensor:
        return outputs.sum() * float("nan")

    results: list[StepResult] = []
    train(
        linear_state(),
        batches(2),
        total_steps=1,
        grad_accumulation=1,
        precision=Precision.of(CPU, "fp32"),
        device=CPU,
        loss_fn=nan_loss,
        on_step=collect(results),
    )
    assert not results[0].finite


def test_precision_names() -> None:
    assert Precision.of(CPU, "fp32").dtype is None and not Precision.of(CPU, "fp32").scaler().is_enabled()
    assert Precision.of(CPU, "bf16").dtype == torch.bfloat16
    cuda = Precision.of(torch.device("cuda"), "fp16")
    assert (cuda.device_type, cuda.dtype) == ("cuda", torch.float16)
