"""An HSDP training script (FSDP2's ``fully_shard`` over a 2-D mesh, replicate x shard) with no ddpjob code:
what ``torchrun`` runs anywhere. Under ddpjob each shard is verified across its replicas anyway
(``spec.syncCheck.autoInstrument``, docs/your-code.md "HSDP and FSDP2").

Run it on this machine with ``ddpjob local examples/hsdp.yaml`` (2 nodes x 2 processes: 2 replicas of 2
shards), or ``torchrun --nproc-per-node 4 examples/hsdp.py``. ``STEPS`` sets the number of optimizer steps,
``SHARDS`` the size of the shard dimension (the world size must be a multiple of it; 1 replica is FSDP).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def main() -> None:
    steps, shards = int(os.environ.get("STEPS", "40")), int(os.environ.get("SHARDS", "2"))
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    replicas = world // shards
    dims = (replicas, shards) if replicas > 1 else (shards,)
    names = ("replicate", "shard") if replicas > 1 else ("shard",)
    mesh = init_device_mesh("cpu", dims, mesh_dim_names=names)
    torch.manual_seed(0)  # every rank builds the same model; fully_shard keeps each rank's shard of it
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(1 + dist.get_rank())  # each rank its own data
    for _ in range(steps):
        inputs = torch.randn(16, 16)
        loss = nn.functional.mse_loss(model(inputs), inputs.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if dist.get_rank() == 0:
        print(f"trained {steps} steps on a {' x '.join(map(str, dims))} mesh, last loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
