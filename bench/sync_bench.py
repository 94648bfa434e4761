"""How much does verification cost? One check_in_sync vs one training step vs a naive full comparison.

    python bench/sync_bench.py [--ranks 2] [--hidden 1024] [--layers 4] [--repeat 10]

Relaunches itself under torchrun (CPU, gloo) unless already launched. Each rank builds the same MLP
(``layers`` hidden layers of ``hidden`` units, a few million parameters), then times, as medians:

* ``step``: one DDP training step (forward, backward with the gradient all-reduce, AdamW update);
* ``check``: one :func:`ddp_trainer.sync.check_in_sync` of parameters and buffers (fingerprint + 2 tiny
  all_reduces);
* ``check_in_sync``: the same without the buffer broadcast; ``buffers``: the buffer broadcast alone;
* ``fingerprint``: the local part of the check alone;
* ``naive``: all_gather every rank's full parameter vector and compare it with this rank's, the
  obvious way to check (bytes on the wire proportional to the model size times the ranks).

Bytes on the wire are measured: during one check every collective call is wrapped and the payload this
rank hands to it is added up (all_reduce, all_gather and broadcast tensors). Run it at two sizes, e.g.
``--hidden 320`` and ``--hidden 1024`` (10x the parameters), to see that the check's traffic stays put.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "trainer_image"))

from ddp_trainer import sync


def timed(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm up (caches, allocator)
    samples = []
    for _ in range(repeat):
        dist.barrier()
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


@contextmanager
def counting_bytes() -> Iterator[list[int]]:
    """Count the payload bytes this rank passes to all_reduce, all_gather and broadcast."""
    total = [0]
    originals = {name: getattr(dist, name) for name in ("all_reduce", "all_gather", "broadcast")}

    def wrap(name: str) -> Callable[..., object]:
        def counted(tensor: object, *args: object, **kwargs: object) -> object:
            payload = args[0] if name == "all_gather" else tensor  # all_gather(outputs, input)
            assert isinstance(payload, torch.Tensor)
            total[0] += payload.numel() * payload.element_size()
            return originals[name](tensor, *args, **kwargs)

        return counted

    for name in originals:
        setattr(dist, name, wrap(name))
    try:
        yield total
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


def naive_check(model: nn.Module) -> bool:
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    return all(torch.equal(flat, other) for other in gathered)


def bench(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.hidden, args.hidden), nn.BatchNorm1d(args.hidden), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(args.hidden, 10))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.hidden)
    y = torch.randint(0, 10, (args.batch,))

    def step() -> None:
        nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def check() -> None:
        sync.broadcast_buffers_(ddp)  # as the trainer does (see docs/trainer.md, "Buffers")
        assert sync.check_in_sync(ddp).in_sync

    times = {
        "step": timed(step, args.repeat),
        "check": timed(check, args.repeat),
        "check_in_sync": timed(lambda: sync.check_in_sync(ddp), args.repeat),
        "buffers": timed(lambda: sync.broadcast_buffers_(ddp), args.repeat),
        "fingerprint": timed(lambda: sync.fingerprint(ddp), args.repeat),
        "naive": timed(lambda: naive_check(model), args.repeat),
    }
    params = sum(p.numel() for p in model.parameters())
    tensors = len(sync.named_tensors(ddp))
    with counting_bytes() as check_bytes:
        assert sync.check_in_sync(ddp).in_sync
    with counting_bytes() as naive_bytes:
        naive_check(model)
    if dist.get_rank() == 0:
        world = dist.get_world_size()
        print(f"model: {params / 1e6:.2f} M parameters in {tensors} tensors; {world} ranks, gloo, CPU")
        print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s) per rank, batch {args.batch}")
        for name, seconds in times.items():
            print(f"  {name:12s} {seconds * 1e3:9.2f} ms")
        print(f"  check / step        {times['check'] / times['step']:.3f}")
        print(f"  check / naive       {times['check'] / times['naive']:.3f}")
        print(f"  naive / step        {times['naive'] / times['step']:.3f}")
        print(
            f"  bytes on the wire per rank (measured): check {check_bytes[0]:,} B, naive {naive_bytes[0]:,} B"
        )
        print(f"  check every 100 steps costs {times['check'] / (100 * times['step']):.2%} of training")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    if "RANK" in os.environ:
        bench(args)
        return
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks)]
    sys.exit(subprocess.call([*cmd, os.path.abspath(__file__), *sys.argv[1:]]))


if __name__ == "__main__":
    main()
