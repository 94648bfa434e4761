"""One worker of test_heal_multiprocess: trains under DDP (gloo) with ``SyncHealth``, as a launcher's worker
(``env://``, ``DDPJOB_LAUNCH_STATE`` in a pod folder of its own); when a peer is lost it heals in place
through :class:`ddp_trainer.sync.heal.Healer`, from the notice the test process writes as its launcher
would. What it saw goes to ``OUT/rank<first rank>.jsonl``: one line per step, one per heal, one at the end.

    RANK=.. WORLD_SIZE=3 MASTER_ADDR=.. MASTER_PORT=.. DDPJOB_LAUNCH_STATE=OUT/podR/launch-state.json \\
        python heal_scenarios.py OUT STEPS
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_trainer.checkpoint import checkpoints, provenance
from ddp_trainer.core import distributed
from ddp_trainer.core.state import TrainState
from ddp_trainer.sync import SyncConfig, SyncHealth
from ddp_trainer.sync.heal import Healer, checkpoint_fence

STEP_SECONDS = 0.05
"""A pause per step: the test kills a peer mid-run, not after the end."""


def build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))
    return module, torch.optim.AdamW(module.parameters(), lr=1e-2)


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()


def digest(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, str]:
    model, buffers, optim = hashlib.sha256(), hashlib.sha256(), hashlib.sha256()
    for name, t in module.named_parameters():
        model.update(name.encode() + _bytes(t))
    for name, t in module.named_buffers():
        buffers.update(name.encode() + _bytes(t))
    state = optimizer.state_dict()
    for index in sorted(state["state"]):
        for key, value in sorted(state["state"][index].items()):
            optim.update(f"{index}.{key}".encode() + (_bytes(value) if torch.is_tensor(value) else b""))
    return {"model": model.hexdigest(), "buffers": buffers.hexdigest(), "optim": optim.hexdigest()}


def one_step(state: TrainState) -> None:
    """Step ``state.step + 1`` on this rank's batch of it (a function of the step and the current rank)."""
    n, rank = state.step + 1, dist.get_rank()
    gen = torch.Generator().manual_seed(1000 * n + rank)
    x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 1, generator=gen)
    state.optimizer.zero_grad(set_to_none=True)
    nn.functional.mse_loss(state.model(x), y).backward()
    state.optimizer.step()
    state.step += 1


def main() -> None:
    out, steps = Path(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(1)
    distributed.settle_gloo_at_exit()
    launch = distributed.read_launch_env(os.environ)
    path = out / f"rank{launch.rank}.jsonl"

    def record(kind: str, state: TrainState, **extra: Any) -> None:
        line = {"kind": kind, "t": time.time(), "pid": os.getpid(), "rank": dist.get_rank()}
        line |= {"world": dist.get_world_size(), "step": state.step}
        module = state.model.module if isinstance(state.model, DDP) else state.model
        with path.open("a") as f:
            f.write(json.dumps(line | digest(module, state.optimizer) | extra) + "\n")

    identity = provenance.Identity("default", "heal", "uid-heal")
    writer = provenance.Writer(identity, {"world_size": 0})
    store = checkpoints.open_store(out / "checkpoints")
    with distributed.process_group(launch, "gloo", torch.device("cpu"), 30):
        module, optimizer = build()
        state = TrainState(DDP(module), optimizer, torch.amp.GradScaler("cpu", enabled=False))
        config = SyncConfig.from_env(total_steps=steps, every=5, probe_every=0, write_report=False)
        health = SyncHealth(state.model, optimizer, config, scaler=state.scaler, state=state)
        healer = Healer(timeout=timedelta(seconds=30))
        while state.step < steps:
            before = state.step
            try:
                one_step(state)
                health.step()
            except Exception as err:
                healed = healer.heal(
                    err,
                    state,
                    dropped=state.step == before,
                    health=health,
                    fence=checkpoint_fence(store, writer),
                )
                if healed is None:
                    raise
                record("healed", state, **dataclasses.asdict(healed), failed=str(err)[:200])
                continue
            record("step", state)
            time.sleep(STEP_SECONDS)
        health.check("final")
        record("done", state, checks=health.tally.checks, in_sync=health.tally.last_check_ok)


if __name__ == "__main__":
    main()
