"""One of two gloo processes for test_heal_multiprocess's pins of what leaving a group does (torch 2.15):
rank 1 blocks in an all-reduce that rank 0 never joins; rank 0, a second later, leaves the group
(``abort()`` and ``destroy_process_group()``: ``reform.abandon_group``), having built a DDP wrapper on it
or not (``MODE``: ``plain``, ``ddp``, ``ddp-sever``: then ``reform.sever_connections`` too). Rank 1 prints
how long its all-reduce took to fail: at once, or at the group's timeout (:data:`TIMEOUT`).

    python gloo_leave.py RANK PORT MODE
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_trainer.core import reform

TIMEOUT = timedelta(seconds=6)


def main() -> None:
    rank, port, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    store = reform.bootstrap_store("127.0.0.1", port, rank, 2, timedelta(seconds=30))
    dist.init_process_group(
        "gloo", store=dist.PrefixStore("leave", store), rank=rank, world_size=2, timeout=TIMEOUT
    )  # type: ignore[attr-defined]
    module = nn.Linear(4, 4)
    if mode != "plain":
        DistributedDataParallel(module)(torch.ones(2, 4)).sum().backward()
    dist.barrier()
    if rank == 1:
        started = time.perf_counter()
        try:
            dist.all_reduce(torch.ones(3))
        except RuntimeError:
            print(f"failed after {time.perf_counter() - started:.2f}", flush=True)
        return
    time.sleep(1)
    reform.abandon_group()
    if mode == "ddp-sever":
        reform.sever_connections()
    time.sleep(TIMEOUT.total_seconds() + 2)  # alive, as a survivor waiting for its notice


if __name__ == "__main__":
    main()
