"""SyncHealth across real ranks (run by tests/integration/trainer/test_health.py under torchrun,
gloo): one scenario
per run, named by argv[1]; each rank writes what happened to ``<out>/rank<R>.json``."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_trainer.sync import SyncHealth


def model(width: int = 8) -> nn.Module:
    torch.manual_seed(0)
    return DistributedDataParallel(nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 1)))


def sharded_model(mesh_shape: tuple[int, ...]) -> nn.Module:
    """FSDP2 over a 1-D mesh (FSDP) or a 2-D one (HSDP: replicate x shard), the same seed on every rank."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    names = ("replicate", "shard")[-len(mesh_shape) :]
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    for layer in (net[0], net[2], net):
        fully_shard(layer, mesh=mesh)
    return net


def train(health: SyncHealth, net: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        loss = net(torch.randn(4, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        health.step(loss, samples=4)


def main() -> None:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result: dict[str, Any] = {}
    started = time.monotonic()
    try:
        if scenario == "other_model":  # rank 1 passes another (unwrapped) model: refused at the first check
            width = 8 if rank == 0 else 9
            SyncHealth(nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 1)), every=5)
        elif scenario == "more_steps":  # rank 1 takes 2 steps more: its check is never joined
            net = model()
            optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
            with SyncHealth(net, optimizer, every=5, peer_timeout=5) as health:
                train(health, net, optimizer, 12 if rank == 0 else 14)
        elif scenario == "repair":  # rank 1 drifts; Repair re-broadcasts rank 0's model and goes on
            net = model()
            optimizer = torch.optim.AdamW(net.parameters(), lr=0.01)
            with SyncHealth(net, optimizer, total_steps=10, every=5, on_divergence="Repair") as health:
                train(health, net, optimizer, 3)
                if rank == 1:
                    with torch.no_grad():
                        next(net.parameters()).view(-1)[0] += 1e-3
                train(health, net, optimizer, 7)
            result["report"] = health.last_report
        elif scenario in ("hsdp_repair", "fsdp"):  # SyncHealth in the script's own loop, FSDP2's model
            net = sharded_model((2, 2) if scenario == "hsdp_repair" else (4,))
            optimizer = torch.optim.AdamW(net.parameters(), lr=0.01)
            with SyncHealth(net, optimizer, total_steps=10, every=5, on_divergence="Repair") as health:
                train(health, net, optimizer, 3)
                if rank == 3:  # replica 1 of shard 1 drifts; its replica group [1, 3] repairs from rank 1
                    with torch.no_grad():
                        next(net.parameters()).to_local().view(-1)[0] += 1e-3
                train(health, net, optimizer, 7)
            result["report"] = health.last_report
            result["digest"] = [float(p.to_local().double().sum()) for p in net.parameters()]
        result["ok"] = True
    except Exception as err:  # what the scenario is about: the error and how long it took
        result.update(ok=False, error=f"{type(err).__name__}: {err}")
    result["seconds"] = time.monotonic() - started
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    sys.stdout.flush()
    import os

    os._exit(0)  # the peers may be gone: no teardown of the process group


if __name__ == "__main__":
    main()
