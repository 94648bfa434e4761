"""Scripts with no ddpjob code, run by tests/integration/trainer/test_autoinstrument.py under torchrun
(gloo), with
and without the no-code-change hook on PYTHONPATH. One scenario per run, named by argv[1]; rank 0 saves
its final parameters and buffers to argv[2] (``torch.save``).

``SETTLE_AT_EXIT`` (seconds; the run without the hook only): wait that long after
``destroy_process_group``, as the hook does at exit, so that torch's own gloo abort at exit
(docs/your-code.md, "A known torch issue at exit") cannot fail the plain-torch side of a comparison.
The runs with the hook leave it unset: there, the hook's own settling is what is tested."""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

STEPS = int(os.environ.get("STEPS", "20"))


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))


def train(models: list[nn.Module], optimizers: list[torch.optim.Optimizer], extra_step_on: int = -1) -> None:
    for step in range(1, STEPS + 1):
        inputs = torch.randn(16, 8)
        for model, optimizer in zip(models, optimizers, strict=True):
            loss = nn.functional.mse_loss(model(inputs), inputs.sum(dim=1, keepdim=True))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if step == 7 and os.environ.get("NUDGE_SECOND") == str(dist.get_rank()):
            with torch.no_grad():  # a fault in the second model on one rank: the check must see it
                next(models[-1].parameters()).view(-1)[0] += 1e-3
    if dist.get_rank() == extra_step_on:
        optimizers[0].step()  # one more step on this rank alone: the ranks disagree on the step count


def main() -> None:
    scenario, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    if scenario == "no-ddp":  # a process group, but no DDP model: averaged by hand
        model = net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        train([model], [optimizer])
        final: nn.Module = model
    elif scenario == "two-models":
        first, second = DistributedDataParallel(net()), DistributedDataParallel(net())
        optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (first, second)]
        torch.manual_seed(1 + dist.get_rank())
        train([first, second], optimizers)
        final = second
    elif scenario == "resumed-at-the-end":  # its own snapshot says every epoch is done: no step is taken
        model = DistributedDataParallel(net())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        epochs_run = STEPS  # as minGPT-ddp's Trainer reads it back from its snapshot
        for _ in range(epochs_run, STEPS):
            train([model], [optimizer])
        final = model
    elif scenario == "compiled":  # nanoGPT's order: compiled, then wrapped (dynamo traces; eager kernels)
        model = DistributedDataParallel(torch.compile(net(), backend="eager"))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        torch.manual_seed(1 + dist.get_rank())
        train([model], [optimizer])
        final = model
    else:  # "plain", "uneven"
        model = DistributedDataParallel(net())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        torch.manual_seed(1 + dist.get_rank())  # each rank its own data
        train([model], [optimizer], extra_step_on=1 if scenario == "uneven" else -1)
        final = model
    if dist.get_rank() == 0:
        torch.save({k: v.clone() for k, v in final.state_dict().items()}, out)
    dist.destroy_process_group()
    time.sleep(float(os.environ.get("SETTLE_AT_EXIT", "0")))


if __name__ == "__main__":
    main()
