"""What sync health adds to a training step, counted on the CPU (issue 30: the Hugging Face callback seemed
to cost +18 % of a GPT-2's steady-state step time on an H200; on 2026-11-27 the same benchmark gave -1 %,
the two sides' profiles the same operators, and the spread was the host's noise: bench/RESULTS.md).

Between two checks the callback must add nothing a GPU could wait for: no torch call at all (so no
``.item()``, ``float(t)``, ``.cpu()``, ``.tolist()``, ``bool(t)``, ``nonzero``, collective or
``synchronize``), and it must not change what the ``Trainer`` itself does per step. Every torch call of a
real ``transformers.Trainer`` run is counted with a ``TorchFunctionMode`` (plus the ``torch.distributed``
collectives and ``torch.cuda`` synchronisations, which do not pass through it), attributed to the step and
to whether a ``ddp_trainer`` frame is on the stack; a run without the callback gives the baseline. The
compute probe and the callback must leave torch's process-wide settings (deterministic algorithms,
cuDNN, matmul precision, SDPA backends, the cuBLAS workspace variable) and the model's hooks as found.
"""

from __future__ import annotations

import collections
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.utils.deterministic
from torch import nn
from torch.overrides import TorchFunctionMode

import ddp_trainer
from ddp_trainer import contract
from ddp_trainer.sync import probe
from ddp_trainer.sync.health import SyncHealth
from testcluster.ci import skip_or_fail

OURS = str(Path(ddp_trainer.__file__).parent)
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "broadcast",
    "barrier",
    "all_gather_object",
    "broadcast_object_list",
)
SYNCS: tuple[tuple[Any, str], ...] = (
    (torch.cuda, "synchronize"),
    (torch.cuda.Event, "synchronize"),
    (torch.cuda.Stream, "synchronize"),
)


def global_state() -> dict[str, Any]:
    """torch's process-wide settings a probe or a check could leave changed, and the cuBLAS variable."""
    cuda, cudnn = torch.backends.cuda, torch.backends.cudnn
    return {
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "fill_uninitialized_memory": torch.utils.deterministic.fill_uninitialized_memory,  # type: ignore[attr-defined]
        "cudnn": (cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32),
        "matmul": (
            cuda.matmul.allow_tf32,
            cuda.matmul.allow_bf16_reduced_precision_reduction,
            cuda.matmul.allow_fp16_reduced_precision_reduction,
            torch.get_float32_matmul_precision(),
        ),
        "sdpa": (
            cuda.flash_sdp_enabled(),  # type: ignore[no-untyped-call]
            cuda.mem_efficient_sdp_enabled(),  # type: ignore[no-untyped-call]
            cuda.math_sdp_enabled(),  # type: ignore[no-untyped-call]
            cuda.cudnn_sdp_enabled(),  # type: ignore[no-untyped-call]
        ),
        "threads": (torch.get_num_threads(), torch.get_num_interop_threads()),
        "grad": torch.is_grad_enabled(),
        "default_dtype": torch.get_default_dtype(),
        "anomaly": torch.is_anomaly_enabled(),
        "modes": (torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack()),
        "cublas": os.environ.get(contract.CUBLAS_WORKSPACE_ENV),
    }


def hooks(model: nn.Module) -> int:
    """Every hook on the model's modules and parameters."""
    on_modules = sum(
        len(m._forward_pre_hooks)
        + len(m._forward_hooks)
        + len(m._backward_hooks)
        + len(m._backward_pre_hooks)
        for m in model.modules()
    )
    on_params = sum(
        len(p._backward_hooks or {}) + len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
        for p in model.parameters()
    )
    return on_modules + on_params


Calls = dict[int, collections.Counter[str]]


class Counting(TorchFunctionMode):
    """Every torch call (and collective, and CUDA synchronisation) per step: ``theirs[step]`` by name,
    ``ours[step]`` by name and the ``ddp_trainer`` line that made it."""

    def __init__(self) -> None:
        super().__init__()
        self.step = 0
        self.theirs: Calls = collections.defaultdict(collections.Counter)
        self.ours: Calls = collections.defaultdict(collections.Counter)

    def record(self, name: str) -> None:
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code.co_filename.startswith(OURS):
                where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"
                self.ours[self.step][f"{name} at {where}"] += 1
                return
            frame = frame.f_back  # type: ignore[assignment]
        self.theirs[self.step][name] += 1

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.record(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))

    def patch(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def counted(owner: Any, name: str) -> None:
            original = getattr(owner, name)

            def wrapper(*args: Any, **kwargs: Any) -> Any:
                self.record(f"{getattr(owner, '__name__', owner)}.{name}")
                return original(*args, **kwargs)

            monkeypatch.setattr(owner, name, wrapper)

        for name in COLLECTIVES:
            counted(dist, name)
        for owner, name in SYNCS:
            counted(owner, name)


STEPS, EVERY = 12, 5
CHECKED = {EVERY, 2 * EVERY, STEPS}  # the periodic checks and the final one (the initial is at step 0)


def hf_run(
    tmp: Path, callback: Callable[[], Any] | None
) -> tuple[Counting, nn.Module, dict[str, Any], dict[str, Any]]:
    """A GPT-2 trained by a ``transformers.Trainer`` for STEPS steps on the CPU, every torch call counted;
    with ``callback()`` in its callbacks when given. Returns the counts, the model, and the global state
    before and after."""
    try:
        import transformers
    except ImportError as error:
        skip_or_fail(f"transformers is not installed (pip install -e '.[dev]' installs it): {error}")
    counting = Counting()

    class Marker(transformers.TrainerCallback):  # type: ignore[misc,name-defined]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            counting.step = state.global_step + 1

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=16, vocab_size=64)
    model = transformers.GPT2LMHeadModel(config)
    tokens = torch.randint(64, (8 * STEPS, 16), generator=torch.Generator().manual_seed(0))
    args = transformers.TrainingArguments(
        output_dir=str(tmp / "out"),
        max_steps=STEPS,
        per_device_train_batch_size=8,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="steps",
        logging_steps=3,  # the callback reads the logged loss
        disable_tqdm=True,
    )
    callbacks = [Marker()] + ([callback()] if callback is not None else [])
    data = [{"input_ids": t, "labels": t} for t in tokens]
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
    before = global_state()
    with pytest.MonkeyPatch.context() as patches, counting:
        counting.patch(patches)
        trainer.train()
    return counting, model, before, global_state()


def synchealth_callback(**options: Any) -> Callable[[], Any]:
    from ddp_trainer.integrations.transformers import SyncHealthCallback

    return lambda: SyncHealthCallback(every=EVERY, **options)


def test_the_hf_callback_adds_no_torch_call_between_checks_and_leaves_the_trainer_as_it_was(
    single_rank: Path,
) -> None:
    bare, _, _, _ = hf_run(single_rank.parent / "bare", None)
    # the probe on at every check: its capture hook, its pass and its gathers all happen in this run
    with_probe = synchealth_callback(probe_every=EVERY)
    checked, model, before, after = hf_run(single_rank.parent / "with", with_probe)
    assert bare.ours == {}
    for step in range(1, STEPS + 1):
        assert checked.theirs[step] == bare.theirs[step], step  # the Trainer's own work is unchanged
        ours = checked.ours.get(step, collections.Counter())
        if step in CHECKED:
            assert ours, step  # the counter sees a check: it would see a per-step call too
        elif step == 1:  # the probe takes rank 0's first batch (once, in the first forward)
            assert {name.split(" at ")[1].split(":")[0] for name in ours} == {"probe.py"}, ours
        else:
            assert not ours, (step, ours)
    assert checked.ours[0], "the initial check happens before the first step"
    assert after == before  # the probe ran (steps 5 and 10) and left torch's settings as they were
    assert hooks(model) == 0  # the probe's one-shot capture hook is gone


def test_the_count_sees_a_callback_that_reads_the_device_every_step(
    single_rank: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test above can fail: a SyncHealth.step that reads a tensor each step is caught at every step."""
    step = SyncHealth.step

    def reads_every_step(self: SyncHealth, loss: Any = None, samples: int | None = None) -> None:
        float(next(self.subject.model.parameters()).detach().sum())  # as a float(loss) per step would
        step(self, loss, samples)

    monkeypatch.setattr(SyncHealth, "step", reads_every_step)
    checked, _, _, _ = hf_run(single_rank.parent, synchealth_callback(probe_every=0))
    for n in range(1, STEPS + 1):
        assert any(name.startswith("__float__ at transformers.py") for name in checked.ours[n]), n


class Records(nn.Module):
    """Records whether deterministic algorithms were on while it ran, and can raise as torch's kernels do
    under them."""

    def __init__(self, raises: bool = False) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.raises = raises
        self.seen: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        on = (
            torch.are_deterministic_algorithms_enabled()
            and not torch.is_deterministic_algorithms_warn_only_enabled()
        )
        self.seen.append(on)
        if on and self.raises:
            raise RuntimeError("scatter_add_cuda_kernel does not have a deterministic implementation")
        out: torch.Tensor = self.linear(x)
        return out


@pytest.mark.parametrize("raises", [False, True], ids=["passes", "raises"])
@pytest.mark.parametrize("preset", [False, True], ids=["defaults", "changed"])
def test_the_probe_leaves_torch_global_settings_as_it_found_them(
    monkeypatch: pytest.MonkeyPatch, raises: bool, preset: bool
) -> None:
    if preset:  # a user's own choices, each unlike the default, must survive the probe too
        torch.use_deterministic_algorithms(True, warn_only=True)
        monkeypatch.setattr(torch.utils.deterministic, "fill_uninitialized_memory", False)
        monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
        monkeypatch.setenv(contract.CUBLAS_WORKSPACE_ENV, ":16:8")
        torch.set_float32_matmul_precision("high")
    try:
        model = Records(raises)
        prober = probe.Probe(model, group=None, batch=torch.randn(3, 4))
        before = global_state()
        rng = torch.get_rng_state()
        digest, why = prober.attempt()
        assert global_state() == before
        assert torch.equal(rng, torch.get_rng_state())
        assert model.seen == [True]  # deterministic for real inside the pass
        assert (digest == 0) == raises and ("deterministic implementation" in why) == raises
    finally:
        torch.use_deterministic_algorithms(False)
        torch.set_float32_matmul_precision("highest")
