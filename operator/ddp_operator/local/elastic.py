"""``ddpjob local`` for an elastic DDPJob (``spec.elastic``): the rendezvous store in a process of its own,
a lost pod replaced while the others go on, and the world sizes the job ran at, read from the pods' logs.

The store (``python -m ddp_trainer.launch.store``) is what a worker pod would otherwise host: with it
outside, any pod may die, pod 0 included, and the others re-rendezvous at the smaller world; the pod that
replaces it joins at the next step boundary and the world grows back."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from ddp_operator.api.spec import Spec
from ddp_trainer import contract

STORE_WAIT_SECONDS = 60.0
REPLACE_AFTER_SECONDS = 10.0
"""How long a failed pod stays away before its replacement starts: the Job controller's first back-off
(10 s), and long enough for the others to be seen training at the smaller world."""
_WORLD = re.compile(
    rf"^(\S+ \S+) .*{re.escape(contract.ELASTIC_WORLD_LOG)} world size (\d+) verified at step (\d+)"
)


def start_store(
    port: int, env: Mapping[str, str], log_path: Path, say: object = print
) -> subprocess.Popen[bytes]:
    """Start the rendezvous store on 127.0.0.1:``port`` and wait until it answers (saying so)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        store = subprocess.Popen(
            [sys.executable, "-m", "ddp_trainer.launch.store", str(port)],
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + STORE_WAIT_SECONDS
    while time.monotonic() < deadline:
        if store.poll() is not None:
            raise RuntimeError(f"the rendezvous store exited {store.returncode}; its output is in {log_path}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return store
        except OSError:
            time.sleep(0.2)
    store.kill()
    raise RuntimeError(f"the rendezvous store did not answer on :{port} in {STORE_WAIT_SECONDS:.0f} s")


def replaceable(spec: Spec, codes: list[int | None], index: int, replaced: int) -> bool:
    """Whether pod ``index``, which exited, is replaced while the others go on: an elastic job, a failure
    a new pod may get past (not a usage error, a refused checkpoint, a divergence, a faulty rank), at least
    ``minNodes`` pods still running, and fewer than ``max(3, maxRestarts)`` replacements so far (a pod that
    fails every time it starts ends the attempt, as a rigid job's would)."""
    code = codes[index]
    if spec.elastic is None or code in (None, 0) or code in contract.NOT_RETRIED_EXIT_CODES:
        return False
    running = sum(c is None for c in codes)
    return running >= spec.elastic.min_nodes and replaced < max(3, spec.max_restarts)


def worlds(logs: Iterable[Path]) -> list[tuple[int, int]]:
    """``(world size, step)`` of every new world, in time order, from rank 0's log lines."""
    found = []
    for path in logs:
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        found += [(m[1], int(m[2]), int(m[3])) for line in lines if (m := _WORLD.match(line))]
    return [(world, step) for _, world, step in sorted(found)]


def summary(found: list[tuple[int, int]]) -> str:
    """One line: each world size the job ran at, each verified before its first step."""
    if not found:
        return "elastic: no world reported its size (a command of your own: see docs/your-code.md)"
    sizes = " → ".join(str(world) for world, _ in found)
    steps = ", ".join(str(step) for _, step in found)
    return f"elastic: ran at world sizes {sizes} (ranks), each verified before its first step (steps {steps})"
