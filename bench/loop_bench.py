"""The trainer's own loop vs a bare DDP loop on the same model and data: throughput ratio (goal >= 0.98).

    python bench/loop_bench.py [--ranks 2] [--hidden 1024] [--batch 256] [--steps 50 450] [--rounds 3]
    python bench/loop_bench.py --device cuda --ranks 1 --hidden 8192 --layers 4 --batch 4096 --steps 60 260

CPU: gloo, one thread per rank. CUDA: NCCL, one GPU per rank, bf16 autocast on both sides.
Both sides train the same MLP (``build`` below, through the trainer's
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
import json
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
    """The benchmark model: 32 -> H (-> H) x (L - 1) -> 10 with ReLUs (``LOOP_BENCH_HIDDEN``, default 1024;
    ``LOOP_BENCH_LAYERS``, default 2)."""
    hidden = int(os.environ.get("LOOP_BENCH_HIDDEN", "1024"))
    depth = int(os.environ.get("LOOP_BENCH_LAYERS", "2"))
    layers: list[nn.Module] = [nn.Linear(32, hidden), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(hidden, 10))


def bare(steps: int, batch: int, seed: int, device_type: str) -> None:
    """The bare loop, run under torchrun: what the trainer does minus its bookkeeping, on the same data
    (``data.micro_batches``), the same optimizer and, on CUDA, the same bf16 autocast."""
    import contextlib

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    sys.path.insert(0, str(ROOT / "trainer_image"))
    from ddp_trainer.core.config import TrainerConfig
    from ddp_trainer.train.data import micro_batches, synthetic

    cuda = device_type == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    config = TrainerConfig(seed=seed, batch_size=batch)
    torch.manual_seed(seed)
    model = DistributedDataParallel(build(config).to(device), device_ids=[device] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    batches = micro_batches(
        synthetic(config), batch_size=batch, rank=dist.get_rank(), world_size=dist.get_world_size(), seed=seed
    )
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    for _ in range(steps):
        _, x, y = next(batches)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast:
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    dist.destroy_process_group()


def wall(kind: str, steps: int, args: argparse.Namespace, workdir: Path) -> float:
    """Wall time of one whole torchrun of ``kind`` (trainer or bare) for ``steps`` steps."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPJOB_", "PROMETHEUS_"))}
    env |= {
        "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT / "trainer_image"), env.get("PYTHONPATH", "")]),
        "LOOP_BENCH_HIDDEN": str(args.hidden),
        "LOOP_BENCH_LAYERS": str(args.layers),
        "OMP_NUM_THREADS": "1",
        "DDPJOB_METRICS_PORT": "0",
        "DDPJOB_TERMINATION_LOG": str(workdir / f"{kind}-{steps}.json"),
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks)]
    if kind == "trainer":
        cmd += ["--module", "ddp_trainer", f"--device={args.device}", "--model=loop_bench:build"]
        cmd += ["--backend=nccl", "--precision=bf16"] if args.device == "cuda" else ["--backend=gloo"]
        cmd += [f"--steps={steps}", f"--batch-size={args.batch}", "--sync-every=100", "--checkpoint-every=0"]
    else:
        cmd += [str(Path(__file__).resolve()), "--bare-steps", str(steps), "--batch", str(args.batch)]
        cmd += ["--device", args.device]
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
    parser.add_argument("--layers", type=int, default=2, help="hidden layers of width --hidden")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--steps", type=int, nargs=2, default=[50, 450], metavar=("SHORT", "LONG"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bare-steps", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_steps is not None:
        bare(args.bare_steps, args.batch, seed=0, device_type=args.device)
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
    os.environ["LOOP_BENCH_HIDDEN"], os.environ["LOOP_BENCH_LAYERS"] = str(args.hidden), str(args.layers)
    params = sum(p.numel() for p in build(None).parameters())
    print(
        f"MLP 32-{args.layers}x{args.hidden}-10, {params / 1e6:.2f} M parameters, batch {args.batch} per rank"
    )
    where = "NCCL, CUDA, bf16 autocast" if args.device == "cuda" else "gloo, CPU, 1 thread per rank"
    print(f"{args.ranks} ranks, {where}; {short} vs {long} steps, {args.rounds} rounds")
    for (kind, n), values in walls.items():
        print(f"  {kind:8s} {n:5d} steps: wall {', '.join(f'{v:.2f}' for v in values)} s")
    for kind, seconds in best.items():
        print(f"  {kind:8s} {seconds * 1e3:8.2f} ms per step (best walls, differenced)")
    ratio = best["bare"] / best["trainer"]
    print(f"  throughput trainer / bare: {ratio:.3f}   (goal >= 0.98)")
    if args.json:
        figures = {f"{k}_ms_per_step": v * 1e3 for k, v in best.items()} | {"trainer_over_bare": ratio}
        Path(args.json).write_text(json.dumps(figures | {"params_m": params / 1e6, "device": args.device}))


if __name__ == "__main__":
    main()
