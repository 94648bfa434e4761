"""A heal in place against a new worker (issue 57 item 1): what ``ddp_trainer.core.reform`` costs on this
machine, gloo on CPU, next to what a restart pays for each worker.

    .venv/bin/python bench/reform_bench.py [--rounds 5] [--width 1000] [--layers 10]

Two survivor processes hold a model of ``layers`` x ``width``² (10 M parameters by default) with its AdamW
state. Each round:

1. **A new worker** starts (``python``, ``import torch``, ``init_process_group`` into the survivors' world
   3, the model and its empty AdamW built): timed from its ``Popen`` to ready, by part.
2. **The state copy**: the survivors re-form at world 3 with it, and ``copy_state_`` sends rank 0's
   parameters, buffers and AdamW state to it (timed on the joiner: it calls last).
3. **The loss**: the joiner is SIGKILLed; the survivors' next all-reduce fails (timed: failure seen), then
   ``reform`` aborts the group and makes world 2 on a fresh prefix, to its first all-reduce (timed), and
   DDP is wrapped again around the same module (timed: it broadcasts rank 0's parameters).

Prints median [min - max] of the rounds, side by side; the last line is the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

TIMEOUT = timedelta(seconds=120)

COMMON = r"""
import json, sys, time
from datetime import timedelta
t_python = time.time()
import torch
t_torch = time.time()
import torch.distributed as dist
from torch import nn
from ddp_trainer.core import distributed, reform
torch.set_num_threads(1)
distributed.settle_gloo_at_exit()
port, width, layers = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
store = dist.TCPStore("127.0.0.1", port, None, is_master=False, timeout=timedelta(seconds=120))
T = timedelta(seconds=120)
def build():
    torch.manual_seed(0)
    module = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    return module, torch.optim.AdamW(module.parameters(), lr=1e-3)
def put(key, **value):
    store.set(key, json.dumps(value))
"""

SURVIVOR = r"""
rank, rounds = int(sys.argv[1]), int(sys.argv[5])
reform.reform(store, reform.World(rank, 2, "start"), timeout=T)
module, opt = build()
module(torch.ones(4, width)).sum().backward()
opt.step()
opt.zero_grad(set_to_none=True)
for n in range(rounds):
    store.wait([f"grow{n}"])
    reform.reform(store, reform.World(rank, 3, f"grow{n}"), timeout=T)
    reform.copy_state_(module, opt, src=0)
    dist.all_reduce(torch.ones(1))
    store.wait([f"lost{n}"])
    t0 = time.perf_counter()
    try:
        dist.all_reduce(torch.ones(1))
        raise SystemExit("the all-reduce with a killed peer succeeded")
    except RuntimeError:
        pass
    t1 = time.perf_counter()
    reform.reform(store, reform.World(rank, 2, f"shrink{n}"), timeout=T)
    dist.all_reduce(torch.ones(1))
    t2 = time.perf_counter()
    ddp = torch.nn.parallel.DistributedDataParallel(module)
    t3 = time.perf_counter()
    del ddp
    put(f"survivor{n}.{rank}", failure_seen_s=t1 - t0, reform_to_first_allreduce_s=t2 - t1,
        ddp_rewrap_s=t3 - t2)
dist.destroy_process_group()
"""

JOINER = r"""
n = int(sys.argv[5])
reform.reform(store, reform.joiner_world(0, 2, 1, f"grow{n}"), timeout=T)
t_group = time.time()
module, opt = build()
t_ready = time.time()
copied = reform.copy_state_(module, opt, src=0)
t_copied = time.time()
dist.all_reduce(torch.ones(1))
put(f"joiner{n}", python=t_python, torch=t_torch, group=t_group, ready=t_ready, copy_s=t_copied - t_ready,
    copied_bytes=copied.bytes)
time.sleep(600)
"""


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "low": min(values), "high": max(values)}


def show(name: str, values: list[float]) -> str:
    s = spread(values)
    return f"| {name} | {s['median'] * 1000:.0f} ms [{s['low'] * 1000:.0f} - {s['high'] * 1000:.0f}] |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--width", type=int, default=1000)
    parser.add_argument("--layers", type=int, default=10)
    args = parser.parse_args()
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False, timeout=TIMEOUT)  # type: ignore[attr-defined]
    common = [str(store.port), str(args.width), str(args.layers), str(args.rounds)]
    survivors = [subprocess.Popen([sys.executable, "-c", COMMON + SURVIVOR, str(r), *common]) for r in (0, 1)]
    rows: dict[str, list[float]] = {}
    copied = 0
    try:
        for n in range(args.rounds):
            started = time.time()
            argv = [sys.executable, "-c", COMMON + JOINER, "2", *common[:3], str(n)]
            joiner = subprocess.Popen(argv)
            store.set(f"grow{n}", "1")
            j: dict[str, Any] = json.loads(store.get(f"joiner{n}"))
            os.kill(joiner.pid, signal.SIGKILL)
            joiner.wait()
            store.set(f"lost{n}", "1")
            s = [json.loads(store.get(f"survivor{n}.{r}")) for r in (0, 1)]
            copied = j["copied_bytes"]
            for key, value in {
                "new worker: python start": j["python"] - started,
                "new worker: import torch": j["torch"] - j["python"],
                "new worker: store + init_process_group (world 3)": j["group"] - j["torch"],
                "new worker: model + AdamW built (first use)": j["ready"] - j["group"],
                "new worker: Popen to ready": j["ready"] - started,
                "joiner: state copy from rank 0": j["copy_s"],
                "survivor: killed peer's all-reduce fails": max(x["failure_seen_s"] for x in s),
                "survivor: abort + re-form to first all-reduce (world 2)": max(
                    x["reform_to_first_allreduce_s"] for x in s
                ),
                "survivor: DDP wrapped again (world 2)": max(x["ddp_rewrap_s"] for x in s),
            }.items():
                rows.setdefault(key, []).append(value)
        codes = [p.wait(60) for p in survivors]
    finally:
        for p in survivors:
            if p.poll() is None:
                p.kill()
    assert codes == [0, 0], codes
    params = args.layers * (args.width * args.width + args.width)
    print(
        f"\n{params / 1e6:.1f} M parameters, {copied / 1e6:.0f} MB copied; {args.rounds} rounds,",
        "the slower survivor",
    )
    print("| step | median [min - max] |\n|---|---:|")
    for key, values in rows.items():
        print(show(key, values))
    print(json.dumps({"params": params, "copied_bytes": copied, **{k: spread(v) for k, v in rows.items()}}))


if __name__ == "__main__":
    main()
