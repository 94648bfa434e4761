"""A user's DDP script (no ddpjob code) in which one rank raises: ``CRASH_RANK`` at step ``CRASH_STEP``.
Its peers then fail in their next collective ("Connection closed by peer"): they are not the cause."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, 21):
    if step == int(os.environ["CRASH_STEP"]) and dist.get_rank() == int(os.environ["CRASH_RANK"]):
        raise RuntimeError(f"injected crash on rank {dist.get_rank()} at step {step}")
    loss = model(torch.randn(4, 8)).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
