"""The trainer's session (:mod:`ddp_trainer.train.runner`) in one process with a real gloo group of one
rank."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from ddp_trainer.core.config import PodEnv, TrainerConfig
from ddp_trainer.core.distributed import LaunchEnv
from ddp_trainer.sync.fingerprints import dispatch, numba_kernel
from ddp_trainer.train.runner import Session


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("one_rank")
def test_the_info_series_names_the_fingerprint_kernel_in_use_after_a_fallback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def compile_error(lanes: np.ndarray, keys: np.ndarray, blocks: int) -> np.ndarray:
        raise TypeError("No matching definition for argument type(s)")

    monkeypatch.delenv("DDPJOB_FINGERPRINT_IMPL", raising=False)
    monkeypatch.setattr(dispatch, "_broken", {})
    monkeypatch.setattr(dispatch, "_said", set())
    monkeypatch.setattr(dispatch, "COMPILED_MIN_BYTES", 0)  # the small default model takes Numba too
    session = Session(
        TrainerConfig(), PodEnv(job="j", namespace="n"), LaunchEnv(), torch.device("cpu"), "fp32"
    )
    assert session.metrics.info["fingerprint"] == "numba"
    monkeypatch.setattr(numba_kernel, "block_sums", compile_error)
    session.build()  # the initial check: the Numba kernel fails, NumPy computes the same bits
    assert session.tally.checks == 1 and session.tally.last_check_ok
    assert session.metrics.info["fingerprint"] == "numpy"
