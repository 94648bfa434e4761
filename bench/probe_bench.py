"""The compute probe's cost as a share of training, beside the sync check's.

    python bench/probe_bench.py [--ranks 2] [--steps 40] [--repeats 5]

CPU, gloo, one thread per rank (torch.multiprocessing, a file store). The model is the one of
``health_bench``'s trainer side: an MLP 32-2048-2048-10 (4.3 M parameters), AdamW, batch 256 per rank,
wrapped in DDP. Rank 0 times, in the same process and interleaved: ``--steps`` training steps (forward,
backward with DDP's all-reduce, optimizer step); ``--repeats`` sync checks (``SyncHealth.check``); and
``--repeats`` compute probes (``SyncHealth.run_probe``: the probe batch shared once beforehand). It prints
the mean of each and the share of training each costs at its default interval (check every 100 steps,
probe every 1000): ``mean / (interval × step)``. Prints figures, never asserts timings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def rank_main(rank: int, world: int, store: str, steps: int, repeats: int, out: str) -> None:
    os.environ.update(
        OMP_NUM_THREADS="1",
        DDPJOB_METRICS_PORT="0",
        PROMETHEUS_MULTIPROC_DIR=str(Path(out).parent / f"metrics-{rank}"),
        LOCAL_RANK=str(rank),
        RANK=str(rank),
        WORLD_SIZE=str(world),
    )
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from ddp_trainer.sync.health import SyncHealth
    from ddp_trainer.sync.settings import DEFAULT_PROBE_EVERY

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(32, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    config = SyncHealth.Config.from_env(every=10**9, probe_every=DEFAULT_PROBE_EVERY, write_report=False)
    health = SyncHealth(model, optimizer, config)
    torch.manual_seed(rank)
    x, y = torch.randn(256, 32), torch.randint(10, (256,))

    def step() -> None:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    step()  # warm-up; the probe batch is captured here
    health.check("periodic")
    health.run_probe()
    step_times, check_times, probe_times = [], [], []
    per_round = max(1, steps // repeats)
    for _ in range(repeats):
        for _ in range(per_round):
            started = time.perf_counter()
            step()
            step_times.append(time.perf_counter() - started)
        started = time.perf_counter()
        health.check("periodic")
        check_times.append(time.perf_counter() - started)
        started = time.perf_counter()
        found = health.run_probe()
        probe_times.append(time.perf_counter() - started)
        assert found.verdict.kind == "agree", found.message
    if rank == 0:
        mean = {name: sum(v) / len(v) for name, v in (("step", step_times), ("check", check_times))}
        mean["probe"] = sum(probe_times) / len(probe_times)
        Path(out).write_text(json.dumps(mean))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "trainer_image"))
    import torch.multiprocessing as mp

    from ddp_trainer.sync.settings import DEFAULT_EVERY, DEFAULT_PROBE_EVERY

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result")
        mp.spawn(
            rank_main,
            (args.ranks, str(Path(tmp) / "store"), args.steps, args.repeats, out),
            nprocs=args.ranks,
        )
        mean = json.loads(Path(out).read_text())
    step, check, probe = mean["step"], mean["check"], mean["probe"]
    machine = f"{platform.machine()} {os.cpu_count()} cores"
    print(f"# {dt.date.today()} {machine}, {args.ranks} ranks (gloo, 1 thread)")
    print("| what | mean ms | / one step | default interval | share of training |")
    print("|---|---:|---:|---:|---:|")
    print(f"| training step | {step * 1e3:.1f} | 1 | | |")
    print(
        f"| sync check | {check * 1e3:.1f} | {check / step:.3f} | {DEFAULT_EVERY} | "
        f"{check / (DEFAULT_EVERY * step):.4%} |"
    )
    print(
        f"| compute probe | {probe * 1e3:.1f} | {probe / step:.3f} | {DEFAULT_PROBE_EVERY} | "
        f"{probe / (DEFAULT_PROBE_EVERY * step):.4%} |"
    )


if __name__ == "__main__":
    main()
