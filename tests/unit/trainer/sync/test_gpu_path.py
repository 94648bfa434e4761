"""The GPU path on a GPU (``gpu``: skipped, with the reason, where there is none): the compute probe
reproduces itself on Hugging Face models with SDPA attention in fp32 and bf16; the training loop makes no
host synchronisation between two checks, and neither does the Hugging Face callback; the torch fallback
of the fingerprint equals Triton's across chunks."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts, as the pods set it

import pytest
import torch
from torch import nn

from ddp_trainer import contract
from ddp_trainer.core.lossread import LossReader
from ddp_trainer.core.state import TrainState
from ddp_trainer.sync import probe
from ddp_trainer.sync.fingerprints import torch_kernel, torch_plan, triton_kernel
from ddp_trainer.train.loop import Precision, StepResult, train

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="torch.cuda.is_available() is False: no CUDA device"
    ),
]


def hf_model(kind: str, dtype: torch.dtype) -> nn.Module:
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=50304, n_embd=1024, n_layer=8, n_head=16, n_positions=512, attn_implementation="sdpa"
        )
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(
            vocab_size=32000,
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=8,
            num_attention_heads=16,
            num_key_value_heads=4,
            max_position_embeddings=512,
            attn_implementation="sdpa",
        )
        model = transformers.LlamaForCausalLM(config)
    return model.to("cuda", dtype)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_probe_reproduces_itself_on_hf_models_with_sdpa(kind: str, dtype: torch.dtype) -> None:
    assert os.environ[contract.CUBLAS_WORKSPACE_ENV] == contract.CUBLAS_WORKSPACE
    model = hf_model(kind, dtype)
    ids = torch.randint(0, 32000, (8, 512), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    prober = probe.Probe(model, group=None, loss=lambda m: m(input_ids=ids, labels=ids).loss)
    digests = [prober.digest() for _ in range(5)]
    assert len(set(digests)) == 1, digests


class Batches:
    def __init__(self) -> None:
        self.gen = torch.Generator().manual_seed(0)

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> tuple[int, torch.Tensor, torch.Tensor]:
        x = torch.randn(512, 256, generator=self.gen).pin_memory()
        return 0, x, torch.randint(0, 10, (512,), generator=self.gen).pin_memory()


def test_the_steps_between_two_checks_make_no_host_synchronisation() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    state = TrainState(
        model=model, optimizer=optimizer, scaler=Precision.of(torch.device("cuda"), "bf16").scaler()
    )
    reader, seen, losses = LossReader(), [], []

    def on_step(result: StepResult) -> bool:
        losses.append(result.loss)
        seen.append(reader.put(result.loss))
        return True

    def steps(total: int, each: Callable[[StepResult], bool]) -> None:
        cuda = torch.device("cuda")
        precision, loss_fn = Precision.of(cuda, "bf16"), lambda m, out, y: nn.functional.cross_entropy(out, y)
        train(
            state,
            Batches(),
            total_steps=total,
            grad_accumulation=1,
            precision=precision,
            device=cuda,
            loss_fn=loss_fn,
            on_step=each,
        )

    steps(2, lambda r: True)  # warm-up: lazy inits
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:  # any synchronising call (a .item(), a float() of the loss) raises here
        steps(12, on_step)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    seen.append(reader.flush())
    assert seen[0] is None and seen[1:] == [float(x) for x in losses]  # each read one step late, exactly


def test_the_torch_fallback_equals_triton_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    if not triton_kernel.available():
        pytest.skip("Triton is not available on this GPU machine")
    monkeypatch.setitem(torch_plan.CHUNK_BYTES, "cuda", 3 * 8 * 65536)
    gen = torch.Generator("cuda").manual_seed(0)
    tensors = [torch.randn(n, device="cuda", generator=gen) for n in (5 * 65536 * 2 + 3, 7, 0, 65536 * 2)]
    tensors += [
        torch.randn(4001, device="cuda", generator=gen).to(torch.bfloat16)[3:],
        torch.ones(3, 5).cuda().t(),
    ]
    expected = [int(torch_kernel.fingerprint_many([t.cpu()])) for t in tensors]
    flat = [t.contiguous() for t in tensors]
    kinds = {c.direct for c in torch_plan.geometry_for(flat, flat[0].device).chunks}
    assert kinds == {True, False}, kinds  # the fused kernel on a tensor's own memory and on the buffer
    assert torch_kernel.fingerprint_many(tensors).tolist() == expected
    assert triton_kernel.fingerprint_tensors(tensors).tolist() == expected


def test_the_stop_agreement_makes_no_host_synchronisation_and_stops_every_rank_a_step_later() -> None:
    import torch.distributed as dist

    from ddp_trainer.sync.boundary import StopAgreement

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]
    try:
        agree = StopAgreement()
        agree(False)  # warm-up: NCCL's communicator, the pinned slots
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            seen = [agree(requested) for requested in (False, False, True, False)]
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert seen == [False, False, False, True]  # the request of the third step, read at the fourth
    finally:
        dist.destroy_process_group()


def test_the_hf_callback_makes_no_host_synchronisation_between_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30's +18 %: on a GPU, the Hugging Face callback's ``on_step_end`` between two checks makes no
    synchronising call (the CPU count, tests/unit/trainer/integrations/test_callback_cost.py, says it makes
    no torch call at
    all; this is the same on CUDA, NCCL, bf16), while its checks still run and pass."""
    import torch.distributed as dist
    from prometheus_client import values as prometheus_values

    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    from ddp_trainer.integrations.transformers import SyncHealthCallback

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "metrics"))
    monkeypatch.setattr(prometheus_values, "ValueClass", prometheus_values.ValueClass)
    monkeypatch.setenv(contract.METRICS_PORT_ENV, "0")
    monkeypatch.setenv(contract.TERMINATION_LOG_ENV, str(tmp_path / "report.json"))
    steps, every = 12, 5

    class Strict(SyncHealthCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            checking = state.global_step % every == 0 or state.global_step == steps
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode(0 if checking else "error")
            try:  # any synchronising call between two checks raises here
                super().on_step_end(args, state, control, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode(0)

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]
    try:
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=128, n_positions=64, vocab_size=1024)
        tokens = torch.randint(1024, (8 * steps, 64), generator=torch.Generator().manual_seed(0))
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "out"),
            max_steps=steps,
            per_device_train_batch_size=8,
            bf16=True,
            report_to=[],
            save_strategy="no",
            logging_steps=3,
            disable_tqdm=True,
        )
        callback = Strict(every=every, probe_every=every)
        data = [{"input_ids": t, "labels": t} for t in tokens]
        model = transformers.GPT2LMHeadModel(config)
        transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()
        assert callback.health is not None and callback.health.checks == 4  # initial, 5, 10, 12
        assert callback.health.tally.last_check_ok and callback.health.probes == 2
    finally:
        dist.destroy_process_group()
