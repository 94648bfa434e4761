"""The trainer's own loop vs a bare DDP loop on the same model and data: throughput ratio (goal >= 0.98).

    python bench/loop_bench.py [--ranks 2] [--hidden 1024] [--batch 256] [--steps 50 450] [--rounds 3]

CPU, gloo, one thread per rank. Both sides train the same MLP (``build`` below, through the trainer's
``--model``) on the trainer's synthetic dataset with AdamW, the same batch size, seed and sampler:

* trainer: ``torchrun -m ddp_trainer`` with metrics on (an HTTP exporter on an ephemeral port), the sync
  check at the default interval (``--sync-every 100``), no checkpoints;
* bare: the same torchrun, a plain loop: forward, backward (DDP all-reduce), optimizer step.

Start-up (imports, process group, the first verification) is cancelled by differencing two run lengths:
time per step = (wall(long) - wall(short)) / (long - short). Runs alternate over ``--rounds``; the best wall
time of each (side, length) is kept, then differenced (every wall time is printed too). Prints figures,
never asserts timings.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def build(config: object) -> nn.Module:
    """The benchmark model: 32 -> H -> H -> 10 with ReLUs (``LOOP_BENCH_HIDDEN``, default 1024)."""
    hidden = int(os.environ.get("LOOP_BENCH_HIDDEN", "1024"))
    layers = [nn.Linear(32, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10)]
    return nn.Sequential(*layers)


def bare(steps: int, batch: int, seed: int) -> None:
    """The bare loop, run under torchrun: what the trainer does minus its bookkeeping."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    sys.path.insert(0, str(ROOT / "trainer_image"))
    from ddp_trainer.config import TrainerConfig
    from ddp_trainer.data import synthetic

    dist.init_process_group("gloo")
    config = TrainerConfig(seed=seed, batch_size=batch)
    torch.manual_seed(seed)
    model = DistributedDataParallel(build(config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    dataset = synthetic(config)
    sampler = DistributedSampler(dataset, seed=seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=True)
    done, epoch = 0, 0
    while done < steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done += 1
            if done == steps:
                break
        epoch += 1
    dist.destroy_process_group()


def wall(kind: str, steps: int, args: argparse.Namespace, workdir: Path) -> float:
    """Wall time of one whole torchrun of ``kind`` (trainer or bare) for ``steps`` steps."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPJOB_", "PROMETHEUS_"))}
    env |= {
        "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT / "trainer_image"), env.get("PYTHONPATH", "")]),
        "LOOP_BENCH_HIDDEN": str(args.hidden),
        "OMP_NUM_THREADS": "1",
        "DDPJOB_METRICS_PORT": "0",
        "DDPJOB_TERMINATION_LOG": str(workdir / f"{kind}-{steps}.json"),
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks)]
    if kind == "trainer":
        cmd += ["--module", "ddp_trainer", "--device=cpu", "--backend=gloo", "--model=loop_bench:build"]
        cmd += [f"--steps={steps}", f"--batch-size={args.batch}", "--sync-every=100", "--checkpoint-every=0"]
    else:
        cmd += [str(Path(__file__).resolve()), "--bare-steps", str(steps), "--batch", str(args.batch)]
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=workdir, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{kind} run failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, nargs=2, default=[50, 450], metavar=("SHORT", "LONG"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bare-steps", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_steps is not None:
        bare(args.bare_steps, args.batch, seed=0)
        return
    short, long = args.steps
    walls: dict[tuple[str, int], list[float]] = {
        (k, n): [] for k in ("bare", "trainer") for n in (short, long)
    }
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for kind, n in walls:
                walls[kind, n].append(wall(kind, n, args, Path(tmp)))
    best = {k: (min(walls[k, long]) - min(walls[k, short])) / (long - short) for k in ("bare", "trainer")}
    os.environ["LOOP_BENCH_HIDDEN"] = str(args.hidden)
    params = sum(p.numel() for p in build(None).parameters())
    print(
        f"MLP 32-{args.hidden}-{args.hidden}-10, {params / 1e6:.2f} M parameters, batch {args.batch} per rank"
    )
    print(f"{args.ranks} ranks, gloo, CPU, 1 thread per rank; {short} vs {long} steps, {args.rounds} rounds")
    for (kind, n), values in walls.items():
        print(f"  {kind:8s} {n:5d} steps: wall {', '.join(f'{v:.2f}' for v in values)} s")
    for kind, seconds in best.items():
        print(f"  {kind:8s} {seconds * 1e3:8.2f} ms per step (best walls, differenced)")
    print(f"  throughput trainer / bare: {best['bare'] / best['trainer']:.3f}   (goal >= 0.98)")


if __name__ == "__main__":
    main()
