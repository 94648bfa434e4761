"""One worker of test_reform_multiprocess: trains under DDP (gloo), loses a peer, re-forms its group in
place and lets a joiner copy its state (``ddp_trainer.core.reform``). What it saw goes to
``OUT/<role><rank>.jsonl``, one line per phase; the test process hosts the store and drives the phases
through its keys.

    python reform_scenarios.py first RANK PORT OUT    # ranks 0-2 of the first world (3)
    python reform_scenarios.py joiner 0 PORT OUT      # the process that joins the survivors (world 3 again)
"""

from __future__ import annotations

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

from ddp_trainer.core import distributed, reform

TIMEOUT = timedelta(seconds=30)


def build(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    module = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))
    return module, torch.optim.AdamW(module.parameters(), lr=1e-2)


def step(ddp: DDP, optimizer: torch.optim.Optimizer, rank: int, n: int) -> None:
    gen = torch.Generator().manual_seed(1000 * n + rank)
    x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 1, generator=gen)
    optimizer.zero_grad(set_to_none=True)
    nn.functional.mse_loss(ddp(x), y).backward()
    optimizer.step()


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()


def digest(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, str]:
    model, buffers = hashlib.sha256(), hashlib.sha256()
    for name, t in module.named_parameters():
        model.update(name.encode() + _bytes(t))
    for name, t in module.named_buffers():  # BatchNorm's: DDP syncs them at a forward's start, not its end
        buffers.update(name.encode() + _bytes(t))
    optim = hashlib.sha256()
    state = optimizer.state_dict()
    for index in sorted(state["state"]):
        for key, value in sorted(state["state"][index].items()):
            optim.update(f"{index}.{key}".encode() + (_bytes(value) if torch.is_tensor(value) else b""))
    optim.update(repr([sorted(g.items()) for g in state["param_groups"]]).encode())
    return {"model": model.hexdigest(), "buffers": buffers.hexdigest(), "optim": optim.hexdigest()}


class Out:
    def __init__(self, out: Path, label: str) -> None:
        self.path = out / f"{label}.jsonl"

    def record(self, phase: str, module: nn.Module, optimizer: torch.optim.Optimizer, **extra: Any) -> None:
        line = {
            "phase": phase,
            "t": time.time(),
            "pid": os.getpid(),
            "rank": dist.get_rank(),
            "world": dist.get_world_size(),
        }
        with self.path.open("a") as f:
            f.write(json.dumps({**line, **digest(module, optimizer), **extra}) + "\n")


def grown(
    store: dist.TCPStore, me: reform.World, module: nn.Module, opt: torch.optim.Optimizer, out: Out
) -> None:
    """World 3 again: the state copied from rank 0, DDP around the module, one step, all checked."""
    copied = reform.copy_state_(module, opt, src=0)
    out.record("grown", module, opt, bytes=copied.bytes, tensors=copied.tensors)
    ddp = DDP(module)
    step(ddp, opt, me.rank, 5)
    out.record("stepped", module, opt)
    dist.barrier()
    dist.destroy_process_group()


def first(rank: int, store: dist.TCPStore, out: Out) -> None:
    reform.reform(store, reform.World(rank, 3, "world0"), timeout=TIMEOUT)
    module, opt = build(seed=0)
    # no buffer broadcast in the forward: after the kill, gloo's broadcast from rank 0 can complete on rank
    # 1 and fail on rank 0, and rank 1 then waits out the group's timeout in the backward's all-reduce (a
    # heal must tell the survivors of a loss, not wait for each to fail: issue 57); the all-reduce fails
    # on both at once
    ddp = DDP(module, broadcast_buffers=False)
    for n in range(3):
        step(ddp, opt, rank, n)
    out.record("trained", module, opt)
    store.set(f"trained{rank}", "1")
    if rank == 2:
        time.sleep(600)  # until the test SIGKILLs it
    store.wait(["lost"])
    started = time.perf_counter()
    try:
        step(ddp, opt, rank, 3)  # rank 2 is gone: the step's all-reduce fails, and the step is dropped
        failed = ""
    except RuntimeError as e:
        failed = str(e)[:200]
    opt.zero_grad(set_to_none=True)
    del ddp
    me = reform.survivor_world(rank, 3, lost={2}, joiners=0, prefix="world1")
    reform.reform(store, me, timeout=TIMEOUT)
    ddp = DDP(module)
    step(ddp, opt, me.rank, 4)
    out.record("shrunk", module, opt, failed=failed, seconds=time.perf_counter() - started)
    store.set(f"shrunk{rank}", "1")
    store.wait(["grow"])
    del ddp
    me = reform.survivor_world(me.rank, 2, lost=(), joiners=1, prefix="world2")
    reform.reform(store, me, timeout=TIMEOUT)
    grown(store, me, module, opt, out)


def joiner(store: dist.TCPStore, out: Out) -> None:
    module, opt = build(seed=1)  # a fresh model (another seed, so a skipped copy shows) and no Adam state
    me = reform.joiner_world(0, survivors=2, joiners=1, prefix="world2")
    reform.reform(store, me, timeout=TIMEOUT)
    out.record("before_copy", module, opt)
    grown(store, me, module, opt, out)


def main() -> None:
    role, rank, port, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    torch.set_num_threads(1)
    distributed.settle_gloo_at_exit()
    store = dist.TCPStore("127.0.0.1", port, None, is_master=False, timeout=TIMEOUT)  # type: ignore[attr-defined]
    if role == "first":
        first(rank, store, Out(out, f"first{rank}"))
    else:
        joiner(store, Out(out, f"joiner{rank}"))


if __name__ == "__main__":
    main()
