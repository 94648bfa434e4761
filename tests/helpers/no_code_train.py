"""A user's torchrun script with no ddpjob code (examples/plain_ddp.py's loop), paced at ``STEP_SECONDS``
per step so that the test sees it while it runs however fast the machine is. ``CRASH_AT="R,S"``: rank R
raises a RuntimeError at step S (its peers then fail in their next collective); ``NO_DDP=1``: the model is
trained without DistributedDataParallel (nothing to verify)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    steps, pause = int(os.environ["STEPS"]), float(os.environ["STEP_SECONDS"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    model = net if os.environ.get("NO_DDP") == "1" else DistributedDataParallel(net)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(1 + dist.get_rank())
    crash_rank, crash_step = map(int, os.environ.get("CRASH_AT", "-1,-1").split(","))
    for step in range(steps):
        if dist.get_rank() == crash_rank and step == crash_step:
            raise RuntimeError(f"injected crash on rank {crash_rank} at step {crash_step}")
        inputs = torch.randn(16, 16)
        loss = nn.functional.mse_loss(model(inputs), inputs.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(pause)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
