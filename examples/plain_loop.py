"""A hand-written DDP loop whose replicas are verified: build ``SyncHealth``, call ``step()``.

Run it on this machine with ``ddpjob local examples/plain-loop.yaml`` (2 nodes × 2 processes), or
``torchrun --nproc-per-node 2 examples/plain_loop.py``. ``STEPS`` sets the number of optimizer steps.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_trainer.sync import SyncHealth


def main() -> None:
    steps = int(os.environ.get("STEPS", "40"))
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(1 + dist.get_rank())  # each rank its own data
    config = SyncHealth.Config.from_env(total_steps=steps)  # every/policy from spec.syncCheck
    with SyncHealth(model, optimizer, config) as health:
        for _ in range(steps):
            inputs = torch.randn(16, 16)
            loss = nn.functional.mse_loss(model(inputs), inputs.sum(dim=1, keepdim=True))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            health.step(loss, samples=len(inputs))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
