"""What a lost peer costs a worker's process group, per backend (issues 54 and 57): three figures.

    python3 bench/nccl_bench.py                 # NCCL on the first GPU (``make gpu-check`` runs it too)
    python bench/nccl_bench.py --device cpu     # the same with gloo, on any machine

1. **Abort and re-form in one process** (issue 57 item 8): a world-1 group makes its communicator and
   runs an all-reduce; then, ``rounds`` times, the group is aborted (``ProcessGroup.abort()``) and
   destroyed, and a new one is made on a fresh store prefix and runs its first all-reduce. Timed: the
   abort, the re-form to the first all-reduce done, and the cold first group for comparison. Whether
   this torch has ``torch.distributed.shrink_group`` is reported beside it.
2. **A worker killed inside a kernel** (issue 54 item 1, the NCCL part of the silent-peer bound): a
   survivor's launcher ends its workers with SIGKILL while they sit in a collective that never returns.
   A child process makes a group, holds ``--hold-gib`` of device memory and launches a kernel that spins
   (``torch.cuda._sleep``: the way an NCCL kernel spins on a flag its silent peer never sets). Timed:
   the child's start to ready (CUDA, the group, the memory: what a new worker pays), SIGKILL to the
   process reaped, and SIGKILL to its device memory free again.
3. **Two ranks on one device** (NCCL only): whether NCCL makes a communicator of two processes that share
   the one GPU (it refuses, as its docs say, which is why a silent-peer drill with NCCL needs two GPUs).

The last line of stdout is the figures as JSON.
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
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def spread(values: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "low": min(values),
        "high": max(values),
        "rounds": len(values),
        "values": [round(v, 6) for v in values],
    }


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _group(store: dist.Store, backend: str, device: str) -> None:
    """A world-1 default group on ``store``, its communicator made, one all-reduce done."""
    extra: dict[str, Any] = {"device_id": torch.device("cuda", 0)} if device == "cuda" else {}
    dist.init_process_group(
        backend, store=store, rank=0, world_size=1, timeout=timedelta(seconds=60), **extra
    )
    x = torch.ones(1024, device=device)
    dist.all_reduce(x)
    _sync(device)
    assert float(x[0]) == 1.0


def _abort() -> None:
    group = dist.group.WORLD
    if group is not None and hasattr(group, "abort"):
        group.abort()
    else:  # older torch: the private helper (pinned to what this torch has)
        dist.distributed_c10d._abort_process_group()
    dist.destroy_process_group()


def reform(backend: str, device: str, rounds: int) -> dict[str, Any]:
    base = dist.TCPStore("127.0.0.1", free_port(), 1, is_master=True, wait_for_workers=False)
    started = time.perf_counter()
    _group(dist.PrefixStore("cold", base), backend, device)
    cold = time.perf_counter() - started
    aborts, reforms = [], []
    for n in range(rounds):
        started = time.perf_counter()
        _abort()
        aborted = time.perf_counter()
        _group(dist.PrefixStore(f"round{n}", base), backend, device)
        reforms.append(time.perf_counter() - aborted)
        aborts.append(aborted - started)
    dist.destroy_process_group()
    return {
        "cold_group_s": cold,
        "abort_s": spread(aborts),
        "reform_to_first_allreduce_s": spread(reforms),
        "has_shrink_group": hasattr(dist, "shrink_group"),
    }


CHILD = r"""
import sys, time, torch, torch.distributed as dist
from datetime import timedelta
device, backend, port, gib = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
extra = {"device_id": torch.device("cuda", 0)} if device == "cuda" else {}
store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, wait_for_workers=False)
dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timedelta(seconds=60), **extra)
held = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=device)
x = torch.ones(1024, device=device)
dist.all_reduce(x)
if device == "cuda":
    torch.cuda.synchronize()
    torch.cuda._sleep(2**40)  # spins on the device far longer than the test, as a hung collective does
print("ready", flush=True)
time.sleep(3600)
"""


def _free_bytes() -> int:
    return torch.cuda.mem_get_info()[0]


def killed_in_kernel(backend: str, device: str, rounds: int, hold_gib: float) -> dict[str, Any]:
    starts, reaped, freed = [], [], []
    for _ in range(rounds):
        before = _free_bytes() if device == "cuda" else 0
        started = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, device, backend, str(free_port()), str(hold_gib)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        if line != "ready":
            child.kill()
            raise RuntimeError(f"the child did not get ready: {line!r}, exit {child.wait()}")
        starts.append(time.perf_counter() - started)
        time.sleep(0.5)  # the kernel is running
        killed = time.perf_counter()
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        reaped.append(time.perf_counter() - killed)
        if device == "cuda":  # the driver frees the context after the process is gone
            deadline = killed + 60
            while _free_bytes() < before - 2**30 and time.perf_counter() < deadline:
                time.sleep(0.005)
            freed.append(time.perf_counter() - killed)
    out = {"child_start_to_ready_s": spread(starts), "kill_to_reaped_s": spread(reaped)}
    if freed:
        out["kill_to_memory_free_s"] = spread(freed)
    out["hold_gib"] = hold_gib
    return out


DUPLICATE = r"""
import sys, torch, torch.distributed as dist
from datetime import timedelta
rank, port = int(sys.argv[1]), int(sys.argv[2])
store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, wait_for_workers=False)
dist.init_process_group("nccl", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=20),
                        device_id=torch.device("cuda", 0))
x = torch.ones(4, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
print("sum", float(x[0]), flush=True)
"""


def two_ranks_one_gpu() -> dict[str, Any]:
    port = free_port()
    children = [
        subprocess.Popen(
            [sys.executable, "-c", DUPLICATE, str(rank), str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ, NCCL_DEBUG="WARN"),
        )
        for rank in (0, 1)
    ]
    said = []
    for child in children:
        try:
            out, _ = child.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            out, _ = child.communicate()
        said.append({"exit": child.returncode, "tail": out.strip().splitlines()[-3:]})
    works = all(s["exit"] == 0 for s in said)
    return {"works": works, "ranks": said}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hold-gib", type=float, default=8.0)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("nccl_bench: no CUDA device here; --device cpu measures the same with gloo")
    backend = "nccl" if args.device == "cuda" else "gloo"
    hold = args.hold_gib if args.device == "cuda" else 0.0
    figures: dict[str, Any] = {"backend": backend, "torch": torch.__version__}
    figures["reform"] = reform(backend, args.device, args.rounds)
    print("reform:", json.dumps(figures["reform"]), flush=True)
    figures["killed_in_kernel"] = killed_in_kernel(backend, args.device, max(3, args.rounds // 2), hold)
    print("killed_in_kernel:", json.dumps(figures["killed_in_kernel"]), flush=True)
    if args.device == "cuda":
        figures["two_ranks_one_gpu"] = two_ranks_one_gpu()
        print("two_ranks_one_gpu:", json.dumps(figures["two_ranks_one_gpu"]), flush=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
