"""The trainer's own loop vs a bare DDP loop on the same model and data: throughput ratio (goal >= 0.98),
in paired rounds (``bench/paired.py``).

    python bench/loop_bench.py [--ranks 2] [--hidden 1024] [--batch 256] [--steps 50 450] [--rounds 5]
    python bench/loop_bench.py --device cuda --ranks 1 --hidden 8192 --layers 4 --batch 4096 --steps 60 260 \
        --data staged

CPU: gloo, one thread per rank. CUDA: NCCL, one GPU per rank, bf16 autocast on both sides.
Both sides train the same MLP (``build`` below, through the trainer's ``--model``) on the trainer's
synthetic dataset with AdamW, the same batch size, seed and sampler, through the same ``micro_batches``:

* trainer: ``torchrun -m ddp_trainer`` as a pod runs it: its metrics on (the Prometheus multiprocess files
  and the HTTP endpoint on a free port), the sync check and the compute probe every 100 steps (so each
  window holds both), no checkpoints;
* bare: the same torchrun, a plain loop: forward, backward (DDP all-reduce), optimizer step.

``--data``: ``loader`` (the default) builds each batch in the DataLoader, one sample at a time (the
trainer's built-in ``synthetic`` set): on a GPU that host work leaves the GPU idle most of each step, which
hides what the trainer adds on the GPU. ``staged`` keeps the same samples on the device (``staged``
below, the trainer's ``--dataset``): a batch is one gather from a device tensor, so the loop measures the
GPU.

How it times (issue 43): both sides run at once, as two torchruns, and take turns. The hooks that
``build`` installs (the model's forward pre-hook, and an optimizer step post-hook) stop each side at window
boundaries, where it waits for its turn (:class:`Turns`). One sample is one window of LONG - SHORT
steps after SHORT warm-up steps, timed inside rank 0 between two synchronisations
(``torch.cuda.synchronize()`` on CUDA): everything the loop does between those optimizer steps (data,
sync checks, metrics, logging) is in it; start-up, the warm-up steps, the waits for a turn and the final
check are not. ``--profile DIR`` records each side's warm-up window (not counted) with ``torch.profiler``
and writes rank 0's table of kernels, by GPU time, to ``DIR/<side>.txt``: where a gap between the sides
comes from. Each side runs one warm-up window, then ``--rounds`` windows in ABBA order (bare = A,
trainer = B); the figure is the median of the per-round ratios bare / trainer time per step (the
trainer's throughput as a share of the bare loop's), its spread and the verdict (``paired.judge``). On
CUDA each window also says how busy the GPU was: the CUDA event time from each step's first forward to its
optimizer step, over the window's wall time; under 90 % is flagged (the loop then measures the host more
than the GPU). Prints figures, never asserts timings.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paired
import torch
from torch import nn
from torch.utils.data import Dataset
from torch.utils.data._utils import collate

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BUSY_FLAG = 0.9  # a comparison with the GPU busy less than this is flagged
PROBE_EVERY = 100  # the sync check and the compute probe: a window of 200 steps holds two of each
TURN_TIMEOUT_S = 1800.0  # a side waiting longer than this for its turn, or the parent for a window, gives up


def build(config: object) -> nn.Module:
    """The benchmark model: 32 -> H (-> H) x (L - 1) -> 10 with ReLUs (``LOOP_BENCH_HIDDEN``, default 1024;
    ``LOOP_BENCH_LAYERS``, default 2). Under the benchmark (``LOOP_BENCH_PLAN`` set) it installs the
    hooks that take turns (:class:`Turns`)."""
    hidden = int(os.environ.get("LOOP_BENCH_HIDDEN", "1024"))
    depth = int(os.environ.get("LOOP_BENCH_LAYERS", "2"))
    layers: list[nn.Module] = [nn.Linear(32, hidden), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(hidden, hidden), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(hidden, 10))
    plan = os.environ.get("LOOP_BENCH_PLAN")
    if plan:
        Turns(json.loads(plan), cuda=os.environ.get("LOOP_BENCH_DEVICE") == "cuda").install(model)
    return model


@dataclass(frozen=True)
class Gathered:
    """One whole batch, gathered on the device; the DataLoader's collate passes it through (below)."""

    inputs: torch.Tensor
    targets: torch.Tensor


def _collate_gathered(batch: list[Gathered], *, collate_fn_map: object = None) -> tuple[torch.Tensor, ...]:
    (one,) = batch
    return one.inputs, one.targets


# default_collate looks an element's type up in this map first (its docstring shows how to extend it):
# a Gathered batch comes out as (inputs, targets), with no per-sample stacking
collate.default_collate_fn_map[Gathered] = _collate_gathered


class Staged(Dataset[tuple[torch.Tensor, ...]]):
    """The synthetic set with its tensors on the device. The DataLoader hands ``__getitems__`` a batch's
    indices at once; it returns the batch as one gather (``x[idx]``), no sample collated on the host."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        return self.x[index], self.y[index]

    def __getitems__(self, indices: list[int]) -> list[Gathered]:
        idx = torch.tensor(indices, dtype=torch.long)
        if self.x.is_cuda:  # a pageable copy would wait for the GPU: pinned and asynchronous instead
            idx = idx.pin_memory().to(self.x.device, non_blocking=True)
        return [Gathered(self.x[idx], self.y[idx])]


def staged(config: Any) -> Staged:
    """The trainer's synthetic dataset (same seed, same samples) staged on ``LOOP_BENCH_DEVICE``
    (``--dataset=loop_bench:staged``; the bare loop calls it too)."""
    from ddp_trainer.train.data import synthetic

    x, y = synthetic(config).tensors  # type: ignore[attr-defined]  # a TensorDataset
    if os.environ.get("LOOP_BENCH_DEVICE") == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    else:
        device = torch.device("cpu")
    return Staged(x.to(device), y.to(device))


class Turns:
    """A side's half of taking turns, in each of its ranks. ``plan``: ``folder`` (where the parent writes
    ``go-<k>`` and rank 0 answers ``done-<k>.json``), ``first`` (warm-up steps), ``window`` (steps per
    sample) and ``count`` (windows). Boundary k falls after optimizer step ``first + k * window``: there
    the rank synchronises, rank 0 reports window k - 1 (its seconds and, on CUDA, the GPU time of its
    steps), and, before the last boundary, every rank waits for ``go-<k>`` and then starts window k."""

    def __init__(self, plan: dict[str, Any], *, cuda: bool) -> None:
        self.folder = Path(plan["folder"])
        self.first, self.window, self.count = int(plan["first"]), int(plan["window"]), int(plan["count"])
        self.rank = int(os.environ.get("RANK", "0"))
        self.cuda = cuda
        self.steps = 0
        self.optimizer_id: int | None = None  # the first optimizer that steps: the training one
        self.start: Any = None  # CUDA event at this step's first forward
        self.spans: list[tuple[Any, Any]] = []
        self.started = 0.0
        self.profile = plan.get("profile") if self.rank == 0 else None
        self.profiler: Any = None

    def install(self, model: nn.Module) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook  # every optimizer's steps

        model.register_forward_pre_hook(self.before_forward)
        register_optimizer_step_post_hook(self.after_step)

    def before_forward(self, module: nn.Module, args: object) -> None:
        if self.cuda and self.start is None:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()

    def after_step(self, optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        if self.optimizer_id is None:
            self.optimizer_id = id(optimizer)
        if id(optimizer) != self.optimizer_id:
            return
        self.steps += 1
        if self.start is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.spans.append((self.start, end))
            self.start = None
        since = self.steps - self.first
        if since >= 0 and since % self.window == 0 and since // self.window <= self.count:
            self.turn(since // self.window)

    def turn(self, boundary: int) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        if boundary > 0 and self.rank == 0:
            gpu = sum(s.elapsed_time(e) for s, e in self.spans) / 1e3 if self.cuda else None
            done = {"seconds": now - self.started, "gpu_seconds": gpu, "steps": self.window}
            part = self.folder / f"done-{boundary - 1}.part"
            part.write_text(json.dumps(done))
            part.replace(self.folder / f"done-{boundary - 1}.json")
        self.spans = []
        if self.profiler is not None:  # the warm-up window ends: its table, before the next turn starts
            self.profiler.stop()
            table = self.profiler.key_averages().table(sort_by="self_device_time_total", row_limit=40)
            side = self.folder.name.removeprefix("turns-")
            Path(self.profile, f"{side}.txt").write_text(table)
            self.profiler = None
        if boundary == self.count:
            return
        go, deadline = self.folder / f"go-{boundary}", time.monotonic() + TURN_TIMEOUT_S
        while not go.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"loop_bench: no turn {boundary} in {TURN_TIMEOUT_S:.0f} s")
            time.sleep(0.001)
        if boundary == 0 and self.profile:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            self.profiler = profile(activities=activities)
            self.profiler.start()
        self.started = time.perf_counter()


def bare(steps: int, batch: int, seed: int, device_type: str, data: str) -> None:
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
    dataset = staged(config) if data == "staged" else synthetic(config)
    batches = micro_batches(
        dataset, batch_size=batch, rank=dist.get_rank(), world_size=dist.get_world_size(), seed=seed
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


def launch(kind: str, steps: int, args: argparse.Namespace, workdir: Path, plan: dict[str, Any]) -> Any:
    """Start one side's torchrun (``kind``: trainer or bare) for ``steps`` steps; its output goes to
    ``<workdir>/<kind>.log``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPJOB_", "PROMETHEUS_"))}
    env |= {
        "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT / "trainer_image"), env.get("PYTHONPATH", "")]),
        "LOOP_BENCH_HIDDEN": str(args.hidden),
        "LOOP_BENCH_LAYERS": str(args.layers),
        "LOOP_BENCH_DEVICE": args.device,
        "LOOP_BENCH_PLAN": json.dumps(plan),
        "OMP_NUM_THREADS": "1",
        "DDPJOB_METRICS_PORT": str(free_port()),  # on, as in a pod (only the trainer reads it)
        "DDPJOB_PROBE_EVERY": str(PROBE_EVERY),
        "DDPJOB_TERMINATION_LOG": str(workdir / f"{kind}.json"),
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks)]
    if kind == "trainer":
        cmd += ["--module", "ddp_trainer", f"--device={args.device}", "--model=loop_bench:build"]
        cmd += ["--backend=nccl", "--precision=bf16"] if args.device == "cuda" else ["--backend=gloo"]
        cmd += [f"--steps={steps}", f"--batch-size={args.batch}", f"--sync-every={PROBE_EVERY}"]
        cmd += ["--checkpoint-every=0"]
        cmd += ["--dataset=loop_bench:staged"] if args.data == "staged" else []
    else:
        cmd += [str(Path(__file__).resolve()), "--bare-steps", str(steps), "--batch", str(args.batch)]
        cmd += ["--device", args.device, "--data", args.data]
    with (workdir / f"{kind}.log").open("w") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            cmd, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def tail(workdir: Path, kind: str) -> str:
    return (workdir / f"{kind}.log").read_text(errors="replace")[-3000:]


class Side:
    """The parent's half of taking turns: each call gives the side its next window and returns that
    window's seconds per step (a ``paired`` sampler); the GPU's busy share of each window is kept."""

    def __init__(self, kind: str, folder: Path, window: int, procs: dict[str, Any], workdir: Path) -> None:
        self.kind, self.folder, self.window, self.procs, self.workdir = kind, folder, window, procs, workdir
        self.next = 0
        self.busy: list[float | None] = []

    def __call__(self) -> float:
        k, self.next = self.next, self.next + 1
        (self.folder / f"go-{k}").touch()
        done, deadline = self.folder / f"done-{k}.json", time.monotonic() + TURN_TIMEOUT_S
        while not done.exists():
            for kind, proc in self.procs.items():  # the other side may end cleanly after its last window
                code = proc.poll()
                if code is not None and (code != 0 or kind == self.kind):
                    raise RuntimeError(
                        f"{kind} ended ({proc.returncode}) before window {k}:\n{tail(self.workdir, kind)}"
                    )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.kind}: no window {k} in {TURN_TIMEOUT_S:.0f} s")
            time.sleep(0.01)
        got = json.loads(done.read_text())
        gpu = got["gpu_seconds"]
        self.busy.append(gpu / got["seconds"] if gpu is not None else None)
        return float(got["seconds"]) / self.window


def stop(procs: dict[str, Any]) -> None:
    """End the sides this run started (their process groups), if still running."""
    for proc in procs.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs.values():
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def measure(args: argparse.Namespace, workdir: Path) -> tuple[paired.Paired, dict[str, list[float | None]]]:
    """Both sides started, their windows taken in paired rounds; (the figure, each side's busy shares)."""
    short, long = args.steps
    window, count = long - short, args.warmup + args.rounds
    steps = short + count * window
    procs: dict[str, Any] = {}
    sides: dict[str, Side] = {}
    try:
        for kind in ("bare", "trainer"):
            folder = workdir / f"turns-{kind}"
            folder.mkdir()
            plan = {"folder": str(folder), "first": short, "window": window, "count": count}
            plan |= {"profile": str(Path(args.profile).resolve())} if args.profile else {}
            procs[kind] = launch(kind, steps, args, workdir, plan)
            sides[kind] = Side(kind, folder, window, procs, workdir)
        figure = paired.compare(
            sides["bare"], sides["trainer"], over="a/b", goal=0.98, rounds=args.rounds, warmup=args.warmup
        )
        for kind, proc in procs.items():
            if proc.wait(timeout=TURN_TIMEOUT_S) != 0:
                raise RuntimeError(f"{kind} run failed ({proc.returncode}):\n{tail(workdir, kind)}")
    finally:
        stop(procs)
    return figure, {kind: side.busy[args.warmup :] for kind, side in sides.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=2, help="hidden layers of width --hidden")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--data", choices=("loader", "staged"), default="loader", help="see the docstring")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--steps",
        type=int,
        nargs=2,
        default=[50, 450],
        metavar=("SHORT", "LONG"),
        help="SHORT warm-up steps, then windows of LONG - SHORT steps (one per sample)",
    )
    parser.add_argument("--rounds", type=int, default=paired.MIN_ROUNDS, help="paired rounds (ABBA), >= 5")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up windows per side, not counted")
    parser.add_argument("--profile", metavar="DIR", help="profile each side's warm-up window into DIR")
    parser.add_argument("--bare-steps", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_steps is not None:
        bare(args.bare_steps, args.batch, seed=0, device_type=args.device, data=args.data)
        return
    short, long = args.steps
    if not 0 < short < long:
        parser.error("--steps SHORT LONG: 0 < SHORT < LONG")
    if args.rounds < paired.MIN_ROUNDS:
        parser.error(f"--rounds: at least {paired.MIN_ROUNDS}")
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            figure, busy = measure(args, Path(tmp))
        except (RuntimeError, ValueError) as error:
            sys.exit(f"loop_bench: {error}")
    report(args, figure, busy)


def report(args: argparse.Namespace, figure: paired.Paired, busy: dict[str, list[float | None]]) -> None:
    short, long = args.steps
    os.environ["LOOP_BENCH_HIDDEN"], os.environ["LOOP_BENCH_LAYERS"] = str(args.hidden), str(args.layers)
    params = sum(p.numel() for p in build(None).parameters())
    print(
        f"MLP 32-{args.layers}x{args.hidden}-10, {params / 1e6:.2f} M parameters, batch {args.batch} per rank"
    )
    where = "NCCL, CUDA, bf16 autocast" if args.device == "cuda" else "gloo, CPU, 1 thread per rank"
    data = "staged on the device (one gather)" if args.data == "staged" else "DataLoader, host-bound"
    print(f"{args.ranks} ranks, {where}; data: {data}")
    print(
        f"{short} warm-up steps, then windows of {long - short} steps; {args.warmup} warm-up window(s), "
        f"{args.rounds} rounds in ABBA order (bare = A, trainer = B)"
    )
    cuda = args.device == "cuda"
    print(
        f"  {'round':>5} {'order':>5} {'bare ms/step':>13} {'trainer ms/step':>16} {'trainer/bare':>13}",
        end="",
    )
    print("  GPU busy bare, trainer" if cuda else "")
    for r, (order, a, b, ratio) in enumerate(
        zip(paired.abba(figure.rounds), figure.a, figure.b, figure.ratios, strict=True)
    ):
        line = f"  {r + 1:5d} {' '.join(order):>5} {a * 1e3:13.2f} {b * 1e3:16.2f} {ratio:13.3f}"
        if cuda:
            line += "  " + ", ".join(percent(busy[k][r]) for k in ("bare", "trainer"))
        print(line)
    print(f"  throughput trainer / bare: {figure.said()}")
    median_busy = {
        k: statistics.median(x for x in v if x is not None) for k, v in busy.items() if v and None not in v
    }
    flagged = any(v < BUSY_FLAG for v in median_busy.values())
    if cuda:
        said = ", ".join(f"{k} {percent(v)}" for k, v in median_busy.items())
        print(
            f"  GPU busy (median of the rounds): {said}"
            + (f"  FLAGGED: under {BUSY_FLAG:.0%}" if flagged else "")
        )
    excluded = (
        f"start-up, the first {short} steps, the waits between turns, the final check; included: data, "
        f"metrics (files and endpoint), a sync check and a compute probe every {PROBE_EVERY} steps"
    )
    print(f"  excluded from each window: {excluded}")
    if args.json:
        figures = {
            "device": args.device,
            "data": args.data,
            "params_m": params / 1e6,
            "ranks": args.ranks,
            "window_steps": long - short,
            "bare_ms_per_step": statistics.median(figure.a) * 1e3,
            "trainer_ms_per_step": statistics.median(figure.b) * 1e3,
            "trainer_over_bare": figure.median,
            "paired": figure.as_json(),
            "busy": median_busy if cuda else None,
            "busy_flagged": flagged if cuda else None,
            "excluded": excluded,
        }
        Path(args.json).write_text(json.dumps(figures))


def percent(share: float | None) -> str:
    return "n/a" if share is None else f"{share:.0%}"


if __name__ == "__main__":
    main()
