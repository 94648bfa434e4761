"""``python -m ddp_trainer.launch.store PORT``: the ``c10d`` rendezvous store of an elastic job, in a
process of its own.

torchrun's ``c10d`` rendezvous keeps its state in a TCPStore that one agent hosts: the node whose address
is the endpoint. Lose that node and the rendezvous is gone with it, and every node restarts (the failure
of PyTorchJob's elastic mode, whose store lived on worker 0). Here no worker hosts it: this process does,
and every agent connects to it (``DDPJOB_RDZV_STORE=external`` makes the launcher say ``is_host=0``), so
any node may leave, node 0 included, and the others re-rendezvous at once. It holds only the rendezvous'
few keys; the workers' own store is made afresh by the agent of each round's rank 0.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Sequence
from datetime import timedelta

log = logging.getLogger("ddp_trainer.launch.store")


def serve(port: int, host: str = "0.0.0.0") -> None:
    """Host the store on ``host:port`` until SIGTERM or SIGINT."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    store = TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    print(
        f"ddpjob rendezvous store: serving on {host}:{port}; every node connects here, none hosts it",
        flush=True,
    )
    stop.wait()
    del store


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python -m ddp_trainer.launch.store PORT", file=sys.stderr)
        return 2
    serve(int(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
