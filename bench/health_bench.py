"""The sync check's share of training inside a Hugging Face ``Trainer`` run, beside the reference trainer's.

    python bench/health_bench.py [--ranks 2] [--steps 300] [--every 100]
    python bench/health_bench.py --gpu     # the callback's cost on one GPU: runtime with it vs without

``--gpu``: the wall time of ``Trainer.train()`` (``on_train_end`` included; ``train_runtime``, which stops
before it, beside it) of a GPT-2 (6 x 512, vocabulary 50304, bf16, batch 8 x 256) under torchrun with
NCCL, world 1, 300 steps, with ``SyncHealthCallback`` (a check every 100) and without, in paired rounds
(``bench/paired.py``: a warm-up run of each side, then 5 rounds in ABBA order; the median ratio, its
spread and the verdict against <= 2 %); prints ``GPU callback cost {json}``, with each side's diagnosis:
start-up (the initial check), the median step between checks, the check steps, the time inside the
callback's ``on_step_end`` and the synchronising calls ``torch.cuda.set_sync_debug_mode`` saw there
(:func:`diagnose`). Both sides initialise
NCCL before ``train()`` (:func:`warm_nccl`), as DDP does in a job of two or more GPUs; the first GPU figure
(+34.6 %, bench/RESULTS.md) was taken without that: its callback side alone paid NCCL's set-up (by the
sources of transformers 5.24 and accelerate, nothing else in a world-1 ``Trainer`` run makes an NCCL
collective; its share is ``nccl_init_s``, not yet measured on a GPU).

CPU, gloo, one thread per rank, the check at the default interval (every 100 steps). Both sides train a
model of about 4 M parameters under torchrun:

* hf: a ``transformers.Trainer`` on a random-init GPT-2 (5 layers, width 256, vocabulary 1024; synthetic
  tokens, batch 8 × 64 per rank) with ``SyncHealthCallback``;
* trainer: ``torchrun -m ddp_trainer`` on an MLP 32-2048-2048-10 (4.3 M parameters), batch 256 per rank.

Each side's rank 0 logs every check with its duration ("check passed (N tensors, X ms)"); the share is the
sum of the periodic and final checks' durations over the wall time from the initial check's log line to
the final one's (the training in between, checks included). Prints figures, never asserts timings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LINE = re.compile(r"^(\S+ \S+) \[rank 0\] INFO step (\d+): (\w+) check passed \((\d+) tensors, ([\d.]+) ms\)")


def hf(steps: int, every: int) -> None:
    """The Hugging Face side, run under torchrun."""
    import logging

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from ddp_trainer.integrations.transformers import SyncHealthCallback

    rank = int(os.environ.get("RANK", "0"))
    logging.getLogger("ddp_trainer").setLevel(logging.INFO if rank == 0 else logging.WARNING)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"%(asctime)s [rank {rank}] %(levelname)s %(message)s"))
    logging.getLogger("ddp_trainer").addHandler(handler)
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=5, n_head=4, n_embd=256, n_positions=64, vocab_size=1024, bos_token_id=0, eos_token_id=0
    )
    model = GPT2LMHeadModel(config)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    tokens = torch.randint(1024, (steps * 8 * world, 64), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": t, "labels": t} for t in tokens]
    args = TrainingArguments(
        output_dir="hf-output",
        max_steps=steps,
        per_device_train_batch_size=8,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    callback = SyncHealthCallback(every=every)
    Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()


def hf_gpu(steps: int, every: int, callback: bool) -> None:
    """One GPU side, run under torchrun (NCCL): prints ``runtime <train_runtime> <steady seconds> <train()
    seconds>`` (``train_runtime`` stops before ``on_train_end``; the last figure is the whole ``train()``
    call, the callback's final check included) and ``diagnosis {json}``: where the callback's time goes
    (see :func:`diagnose`)."""
    import json
    import threading
    import time
    import warnings

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from ddp_trainer.integrations.transformers import SyncHealthCallback

    torch.manual_seed(0)
    config = GPT2Config(n_layer=6, n_head=8, n_embd=512, n_positions=256, vocab_size=50304)
    tokens = torch.randint(50304, (steps * 8, 256), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": t, "labels": t} for t in tokens]
    args = TrainingArguments(
        output_dir="hf-output",
        max_steps=steps,
        per_device_train_batch_size=8,
        bf16=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    marks: dict[str, float] = {}
    ends: dict[int, float] = {}  # step -> when on_step_end began (host clock, no sync)
    inside: dict[int, float] = {}  # step -> seconds inside SyncHealthCallback.on_step_end
    syncs: dict[int, list[str]] = {}  # step -> where torch warned of a synchronising call inside it

    profile_to = os.environ.get("HEALTH_BENCH_PROFILE")  # a diagnostic: torch.profiler over steps 41-60
    profiler = torch.profiler.profile() if profile_to else None

    def profiled(step: int) -> None:
        if profiler is None or step not in (40, 60):
            return
        if step == 40:
            profiler.start()
            return
        profiler.stop()
        averages = profiler.key_averages()
        cpu = averages.table(sort_by="self_cpu_time_total", row_limit=25)
        cuda = averages.table(sort_by="self_cuda_time_total", row_limit=15)
        threads = ", ".join(t.name for t in threading.enumerate())
        Path(f"{profile_to}-{'with' if callback else 'bare'}.txt").write_text(
            f"threads: {threads}\n\n{cpu}\n\n{cuda}\n"
        )

    class Clock(TrainerCallback):  # type: ignore[misc]
        """The time after step 20 and at the end: the steady state, start-up (the first check) excluded."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            marks["begin"] = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            ends[state.global_step] = time.perf_counter()
            if state.global_step == 20:
                torch.cuda.synchronize()
                marks["20"] = time.perf_counter()
            profiled(state.global_step)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            torch.cuda.synchronize()
            marks["end"] = time.perf_counter()

    class Begun(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            marks["begun"] = time.perf_counter()

    class Timed(SyncHealthCallback):  # type: ignore[misc]
        """The callback, its ``on_step_end`` timed and watched by ``torch.cuda.set_sync_debug_mode``."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            started = time.perf_counter()
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    super().on_step_end(args, state, control, **kwargs)
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            inside[state.global_step] = time.perf_counter() - started
            # torch's own "Synchronization debug mode is a prototype feature" (once, at step 1) is no sync
            syncs[state.global_step] = [
                f"{w.filename}:{w.lineno}" for w in seen if "called a synchronizing" in str(w.message)
            ]

    callbacks = [Clock(), Timed(every=every), Begun()] if callback else [Clock(), Begun()]
    trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=data, callbacks=callbacks)
    nccl_s = warm_nccl()
    started = time.perf_counter()
    runtime = trainer.train().metrics["train_runtime"]  # stops before on_train_end: the final check
    torch.cuda.synchronize()
    train_s = time.perf_counter() - started  # the whole of train(), on_train_end included
    print(f"runtime {runtime} {marks['end'] - marks['20']} {train_s}", flush=True)
    found = diagnose(steps, every, marks, ends, inside, syncs) | {"nccl_init_s": nccl_s}
    print("diagnosis " + json.dumps(found), flush=True)


def warm_nccl() -> float:
    """Initialise NCCL before ``train()``, on both sides alike; returns the seconds it took. At world 1
    accelerate wraps no DDP (``use_distributed`` needs two processes), so nothing else runs an NCCL
    collective and the callback's initial check would pay NCCL's communicator set-up inside
    ``train_runtime``; in a real DDP job DDP's constructor pays it in ``Trainer._prepare_for_training``,
    before ``train_runtime`` starts. Warming it here measures what a real job would see."""
    import time

    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 0.0
    started = time.perf_counter()
    flag = torch.zeros(1, device="cuda")
    dist.all_reduce(flag)
    torch.cuda.synchronize()
    return time.perf_counter() - started


def diagnose(
    steps: int,
    every: int,
    marks: dict[str, float],
    ends: dict[int, float],
    inside: dict[int, float],
    syncs: dict[int, list[str]],
) -> dict[str, Any]:
    """Where one side's time goes: ``start_s`` (the callbacks' ``on_train_begin``: the initial check and
    the imports it needs), ``between_ms`` (the median step, host clock, over steps after 20 that neither
    are a check step nor follow one: a per-step cost shows here), ``check_steps_ms`` (the steps that
    check, beside ``between_ms``: a per-check cost shows here), and, with the callback, the seconds
    inside its ``on_step_end`` and the synchronising calls torch saw there, apart for check steps
    (between checks, with the file and line of each: ``sync_sites_between_checks``)."""
    import statistics

    checking = {s for s in range(1, steps + 1) if s % every == 0 or s == steps}
    took = {s: ends[s] - ends[s - 1] for s in ends if s - 1 in ends}
    plain = [s for s in took if s > 20 and s not in checking and s - 1 not in checking]
    out: dict[str, Any] = {
        "start_s": marks["begun"] - marks["begin"],
        "between_ms": 1e3 * statistics.median(took[s] for s in plain) if plain else None,
        "check_steps_ms": {s: round(1e3 * took[s], 2) for s in sorted(checking) if s in took},
    }
    if inside:
        between = [s for s in inside if s not in checking]
        out["callback_between_us"] = 1e6 * statistics.mean(inside[s] for s in between) if between else None
        out["callback_check_ms"] = {s: round(1e3 * inside[s], 2) for s in sorted(checking) if s in inside}
        out["syncs_between_checks"] = sum(len(syncs[s]) for s in between)
        out["syncs_at_checks"] = sum(len(syncs[s]) for s in checking if s in syncs)
        out["sync_sites_between_checks"] = {s: syncs[s] for s in between if syncs[s]}
    return out


def gpu(args: argparse.Namespace) -> None:
    """The callback's cost on one GPU, in paired rounds (``bench/paired.py``): ``--warmup`` (1) run of
    each side, dropped, then ``--rounds`` (5) rounds in ABBA order (bare = A, with the callback = B), one
    torchrun per sample. The figure is the median of the per-round ratios with / bare of the whole
    ``train()`` call's wall time (``on_train_end`` included), its spread and the verdict against <= 1.02
    (2 %); beside it, the same ratios of ``train_runtime`` and of the steady state (step 20 to the end),
    and the diagnosis of each side's fastest run (``start_s``, ``between_ms``, ``check_steps_ms``, ...).
    Excluded: each process's start-up before ``train()`` (imports, the model, NCCL's set-up)."""
    import json
    import statistics

    import paired

    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPJOB_", "PROMETHEUS_"))}
    env |= {
        "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT / "trainer_image"), env.get("PYTHONPATH", "")])
    }
    env |= {"DDPJOB_METRICS_PORT": "0"}
    runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}

    def side(callback: bool, tmp: str) -> Any:
        def sample() -> float:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
            cmd += [
                str(Path(__file__).resolve()),
                "--hf-gpu-steps",
                str(args.steps),
                "--every",
                str(args.every),
            ]
            cmd += ["--callback"] if callback else []
            done = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True)
            lines = done.stdout.splitlines()
            times = [[float(x) for x in ln.split()[1:4]] for ln in lines if ln.startswith("runtime ")]
            found = [json.loads(ln.split(" ", 1)[1]) for ln in lines if ln.startswith("diagnosis ")]
            if done.returncode != 0 or not times:
                sys.exit(
                    f"hf gpu run failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
                )
            runtime, steady, train_s = times[0]
            runs[callback].append(
                {
                    "runtime_s": runtime,
                    "steady_s": steady,
                    "train_s": train_s,
                    "diagnosis": found[0] if found else None,
                }
            )
            return train_s

        return sample

    with tempfile.TemporaryDirectory() as tmp:
        paired.run_rounds(side(False, tmp), side(True, tmp), rounds=args.rounds, warmup=args.warmup)
    bare, with_ = runs[False][args.warmup :], runs[True][args.warmup :]

    def ratio(key: str, goal: float | None) -> paired.Paired:
        a, b = [r[key] for r in bare], [r[key] for r in with_]
        return paired.judge(a, b, over="b/a", goal=goal, direction="at most")

    figure, runtime, steady = ratio("train_s", 1.02), ratio("runtime_s", None), ratio("steady_s", None)
    fastest = {
        cb: min(rs, key=lambda r: r["train_s"])["diagnosis"] for cb, rs in ((False, bare), (True, with_))
    }
    figures = {
        "bare_s": statistics.median(figure.a),
        "with_s": statistics.median(figure.b),
        "overhead_pct": 100 * (figure.median - 1),
        "overhead_low_pct": 100 * (figure.low - 1),
        "overhead_high_pct": 100 * (figure.high - 1),
        "rounds": figure.rounds,
        "verdict": figure.verdict,
        "paired": figure.as_json(),
        "runtime_overhead_pct": 100 * (runtime.median - 1),
        "runtime_paired": runtime.as_json(),
        "steady_overhead_pct": 100 * (steady.median - 1),
        "steady_paired": steady.as_json(),
        "excluded": "each process's start-up before train() (imports, the model, NCCL's set-up)",
        "bare": fastest[False],
        "with": fastest[True],
    }
    print(f"with / bare, train(): {figure.said()}")
    print(f"GPU callback cost {json.dumps(figures)}")


def build(config: object) -> object:
    """The reference trainer's model: MLP 32-2048-2048-10."""
    from torch import nn

    return nn.Sequential(
        nn.Linear(32, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10)
    )


def run(kind: str, args: argparse.Namespace, workdir: Path) -> tuple[float, float, int, int]:
    """(seconds in periodic and final checks, seconds from the initial check to the final one, checks
    counted, tensors per check)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPJOB_", "PROMETHEUS_"))}
    env |= {
        "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT / "trainer_image"), env.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "DDPJOB_METRICS_PORT": "0",
        "DDPJOB_TERMINATION_LOG": str(workdir / f"{kind}.json"),
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks)]
    if kind == "trainer":
        cmd += ["--module", "ddp_trainer", "--device=cpu", "--backend=gloo", "--model=health_bench:build"]
        cmd += [
            f"--steps={args.steps}",
            "--batch-size=256",
            f"--sync-every={args.every}",
            "--checkpoint-every=0",
        ]
    else:
        cmd += [str(Path(__file__).resolve()), "--hf-steps", str(args.steps), "--every", str(args.every)]
    done = subprocess.run(cmd, env=env, cwd=workdir, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{kind} run failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    found = [m for line in (done.stdout + done.stderr).splitlines() if (m := LINE.match(line))]
    if len(found) < 2:
        sys.exit(f"{kind}: no check lines in the output:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")

    def when(stamp: str) -> dt.datetime:
        return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")

    checked = sum(float(m[5]) / 1e3 for m in found if m[3] != "initial")
    span = (when(found[-1][1]) - when(found[0][1])).total_seconds()
    return checked, span, len(found) - 1, int(found[-1][4])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--gpu", action="store_true", help="the callback's cost on one GPU")
    parser.add_argument("--rounds", type=int, default=5, help="--gpu: paired rounds (ABBA), at least 5")
    parser.add_argument("--warmup", type=int, default=1, help="--gpu: warm-up runs of each side, dropped")
    parser.add_argument("--hf-steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--hf-gpu-steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--callback", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hf_gpu_steps is not None:
        hf_gpu(args.hf_gpu_steps, args.every, args.callback)
        return
    if args.gpu:
        gpu(args)
        return
    if args.hf_steps is not None:
        hf(args.hf_steps, args.every)
        return
    print(f"{args.ranks} ranks, gloo, CPU, 1 thread per rank; {args.steps} steps, a check every {args.every}")
    with tempfile.TemporaryDirectory() as tmp:
        for kind, what in (("hf", "HF Trainer, GPT-2 4.2 M"), ("trainer", "reference trainer, MLP 4.3 M")):
            checked, span, checks, tensors = run(kind, args, Path(tmp))
            print(
                f"  {what:32s} {checks} checks of {tensors} tensors: {checked * 1e3:8.1f} ms in checks "
                f"of {span:6.1f} s training = {100 * checked / span:.3f} % (goal <= 0.5 %)"
            )


if __name__ == "__main__":
    main()
