"""The CUDA path: needs a GPU (skipped, with the reason, where there is none)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddp_trainer import sync
from ddp_trainer.sync import replicas
from ddp_trainer.train.model import MLP

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="torch.cuda.is_available() is False: no CUDA device"
    ),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64])
def test_fingerprint_is_the_same_on_cuda_and_cpu(dtype: torch.dtype) -> None:
    t = (torch.randn(3 * replicas._BLOCK // 2 + 7) * 100).to(dtype)
    assert int(sync.fingerprint_tensors([t])[0]) == int(sync.fingerprint_tensors([t.cuda()])[0])
    model = MLP()
    assert torch.equal(sync.fingerprint(model), sync.fingerprint(model.cuda()).cpu())


@pytest.mark.slow
def test_single_gpu_nccl_run_with_bf16_autocast_is_verified(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROMETHEUS_", "DDPJOB_"))}
    env |= {"DDPJOB_METRICS_PORT": "0", "DDPJOB_TERMINATION_LOG": str(tmp_path / "report.json")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    cmd += ["--module", "ddp_trainer", "--device=cuda", "--backend=nccl", "--steps=30", "--sync-every=10"]
    cmd += ["--precision=bf16", f"--checkpoint-dir={tmp_path / 'ckpt'}", "--checkpoint-every=10"]
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["result"], report["verified"], report["checks"]) == ("Succeeded", True, 4)
