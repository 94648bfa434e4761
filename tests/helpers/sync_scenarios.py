"""Run under torchrun (4 ranks): break one rank's model in known ways and record what the sync library
reports. Writes ``<out>/rank<R>.json``; ``test_sync_multiprocess.py`` checks the results."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ddp_trainer import sync
from ddp_trainer.train.model import MLP


def as_dict(report: sync.SyncReport) -> dict[str, Any]:
    return {
        "in_sync": report.in_sync,
        "checked": report.checked,
        "mismatched": list(report.mismatched),
        "ranks": list(report.ranks),
        "max_abs_diff": report.max_abs_diff,
    }


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = MLP()
    results: dict[str, Any] = {}

    def check(name: str, module: torch.nn.Module = model, **kwargs: Any) -> None:
        results[name] = as_dict(sync.check_in_sync(module, **kwargs))

    def heal() -> None:
        sync.broadcast_module_(model, src=0)

    check("clean")
    flat = model.net[0].weight.detach().view(-1)
    ulp = float(torch.nextafter(flat[7], torch.tensor(float("inf"))) - flat[7])
    results["ulp_size"] = ulp
    with torch.no_grad():
        if rank == 2:
            flat[7] = torch.nextafter(flat[7], torch.tensor(float("inf")))
    check("one_ulp")
    heal()
    check("after_broadcast")

    square = model.net[3].weight  # 64 x 64
    with torch.no_grad():
        if rank == 1:
            row = square[5].clone()
            square[5, 0], square[5, 1] = row[1], row[0]
    check("swap")
    heal()
    with torch.no_grad():
        if rank == 3:
            square.copy_(square.t().contiguous())
    check("transposed")
    heal()

    with torch.no_grad():
        if rank == 1:
            model.net[1].running_mean[3] += 0.5
    check("buffer")
    check("buffer_not_checked", buffers=False)
    heal()

    with torch.no_grad():  # two ranks differ, differently: the majority copy (ranks 2, 3) is the reference
        if rank in (0, 1):
            model.net[5].bias[0] += 0.25 * (rank + 1)
    check("two_ranks")
    heal()

    # Optimizer state after a restore that reached one rank only.
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(100 + rank)

    def train(steps: int) -> None:
        for _ in range(steps):
            ddp(torch.randn(16, 32, generator=gen)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()

    train(3)
    saved_optimizer = copy.deepcopy(optimizer.state_dict())
    saved_model = copy.deepcopy(model.state_dict())
    train(2)
    if rank == 3:  # this rank alone restores the older checkpoint
        model.load_state_dict(saved_model)
        optimizer.load_state_dict(saved_optimizer)
    sync.broadcast_module_(model, src=0)  # what a fresh DDP wrapper's constructor broadcast does
    check("restore_model_only")
    check("restore_with_optimizer", extra=sync.optimizer_state_tensors(optimizer, model))
    sync.broadcast_tensors_(sync.optimizer_state_tensors(optimizer, model).values(), src=0)
    check("optimizer_repaired", extra=sync.optimizer_state_tensors(optimizer, model))
    check("control_state", extra={"step": 10 + (rank == 2), "lr": 0.01})

    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float(rank))
    sync.average_module_(model)
    results["average_value"] = float(model.net[0].weight.detach()[0, 0])
    check("averaged")

    half = copy.deepcopy(model).to(torch.bfloat16)
    with torch.no_grad():
        torch.manual_seed(1)
        for p in half.parameters():
            p.copy_(torch.randn_like(p))
        if rank == 2:
            bits = half.net[0].weight.view(-1)[3:4].view(torch.int16)
            bits += 1  # one bf16 ulp
    check("bf16_one_ulp", half)
    results["fingerprint"] = sync.fingerprint(model).tolist()
    (out / f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
