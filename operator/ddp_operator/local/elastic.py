"""``ddpjob local`` for an elastic DDPJob (``spec.elastic``): the rendezvous store in a process of its own,
a lost pod replaced while the others go on, and the world sizes the job ran at, read from the pods' logs.

The store (``python -m ddp_trainer.launch.store``) is what a worker pod would otherwise host: with it
outside, any pod may die, pod 0 included, and the others re-rendezvous at the smaller world; the pod that
replaces it joins at the next step boundary and the world grows back. A store whose process dies is started
again on the same port (:class:`KeptStore`), as the store's Job replaces a lost pod in a cluster; the pods'
launchers give it back their round (``ddp_trainer.launch.rounds.RoundWatch.restore``)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from ddp_operator.api import exits
from ddp_operator.api.spec import Spec
from ddp_trainer import contract

STORE_WAIT_SECONDS = 60.0
REPLACE_AFTER_SECONDS = 10.0
"""How long a failed pod stays away before its replacement starts: the Job controller's first back-off
(10 s), and long enough for the others to be seen training at the smaller world."""
_WORLD = re.compile(
    rf"^(\S+ \S+) .*{re.escape(contract.ELASTIC_WORLD_LOG)} world size (\d+) verified at step (\d+)"
)
_HEAL_COST = re.compile(rf"{re.escape(contract.HEALED_WORLD_LOG)}(\d+) step\(s\) lost(?:, (\d+) bytes sent)?")


def start_store(
    port: int, env: Mapping[str, str], log_path: Path, say: object = print, append: bool = False
) -> subprocess.Popen[bytes]:
    """Start the rendezvous store on 127.0.0.1:``port`` and wait until it answers (saying so)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab" if append else "wb") as log:
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
            raise RuntimeError(
                f"the rendezvous store {exits.exited(store.returncode)}; its output is in {log_path}"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return store
        except OSError:
            time.sleep(0.2)
    store.kill()
    raise RuntimeError(f"the rendezvous store did not answer on :{port} in {STORE_WAIT_SECONDS:.0f} s")


KEEP_POLL_SECONDS = 0.2
GATE_ENV = "DDPJOB_LOCAL_STORE_GATE"
"""A file whose creation lets a lost store's replacement start (a test's knob, read by ``ddpjob local``;
removed once used, so the next loss waits for it again): in a cluster the store's new pod is scheduled and
started, and its name resolves only once it is ready, seconds after the old one was lost, while locally
the store starts again within a fraction of a second; a test opens the gate once it saw what happens
meanwhile. Unset: no gate."""
KEEP_AT_MOST = 5
"""How many times a lost store is started again in one attempt (one that dies each time ends it: the
launchers then wait for it, and fail, as the workers would with a store Job out of back-off)."""


class KeptStore:
    """The rendezvous store's process (:func:`start_store`), started again on the same port when it dies,
    saying so once each time: what the store's Job does in a cluster when its pod is lost (its
    ``backoffLimit``). The new store starts empty; the pods' launchers reconnect and give it back their
    round, so the world that trains on re-forms with it at the next resize."""

    def __init__(
        self,
        port: int,
        env: Mapping[str, str],
        log_path: Path,
        say: Callable[[str], None],
        start: Callable[..., subprocess.Popen[bytes]] = start_store,
        watch: bool = True,
        gate: Path | None = None,
    ) -> None:
        """``watch``: check every :data:`KEEP_POLL_SECONDS` in a thread of its own (else the caller
        calls :meth:`check`); ``gate``: a lost store's replacement starts once this file exists
        (:data:`GATE_ENV`)."""
        self.port, self.env, self.log_path, self.say, self._start = port, env, log_path, say, start
        self.gate = gate
        self.process = start(port, env, log_path)
        self.restarts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="ddpjob-store-keeper", daemon=True)
        if watch:
            self._thread.start()

    def check(self) -> bool:
        """Start the store again if its process ended; False once it cannot be (or may not be again)."""
        code = self.process.poll()
        if code is None or self._stop.is_set():
            return True
        if self.gate is not None:
            if not self.gate.exists():
                return True  # the replacement comes later (a test's knob: a cluster's new pod takes seconds)
            self.gate.unlink(missing_ok=True)
        ended = f"the rendezvous store's process {exits.exited(code)}"
        if self.restarts >= KEEP_AT_MOST:
            self.say(
                f"{ended}, the {self.restarts + 1}th time: not started again (its output is in "
                f"{self.log_path})"
            )
            return False
        self.restarts += 1
        try:
            self.process = self._start(self.port, self.env, self.log_path, append=True)
        except RuntimeError as exc:
            self.say(f"{ended} and could not be started again: {exc}")
            return False
        self.say(
            f"{ended}: a new one serves :{self.port}, as the store's Job replaces a lost pod; it starts "
            "empty, and the pods' launchers give it back their round"
        )
        return True

    def _keep(self) -> None:
        while not self._stop.wait(KEEP_POLL_SECONDS):
            if not self.check():
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=STORE_WAIT_SECONDS + 5)
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


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


Healed = dict[tuple[int, int], tuple[int, int]]
"""The worlds healed in place, ``(world size, step)``, with what each heal cost: steps lost, bytes sent."""


def worlds(logs: Iterable[Path], healed: Healed | None = None) -> list[tuple[int, int]]:
    """``(world size, step)`` of every new world, in time order, from rank 0's log lines; those healed in
    place (rank 0's line says so, with the steps lost and the bytes sent) also go in ``healed``, where
    given."""
    found = []
    for path in logs:
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if m := _WORLD.match(line):
                found.append((m[1], int(m[2]), int(m[3])))
                if healed is not None and (cost := _HEAL_COST.search(line)):
                    healed[(int(m[2]), int(m[3]))] = (int(cost[1]), int(cost[2] or 0))
    return [(world, step) for _, world, step in sorted(found)]


def summary(found: list[tuple[int, int]], healed: Healed | None = None) -> str:
    """One line: each world size the job ran at, each verified before its first step; ``healed``: the
    worlds healed in place (the others' workers started anew), and what those heals cost in all."""
    if not found:
        return "elastic: no world reported its size (a command of your own: see docs/your-code.md)"
    marked = {key: cost for key, cost in (healed or {}).items() if key in found}
    sizes = " → ".join(f"{world}{' (healed)' if (world, step) in marked else ''}" for world, step in found)
    steps = ", ".join(str(step) for _, step in found)
    line = f"elastic: ran at world sizes {sizes} (ranks), each verified before its first step (steps {steps})"
    if marked:
        lost, sent = (sum(cost[i] for cost in marked.values()) for i in (0, 1))
        line += f"; {len(marked)} healed in place: {lost} step(s) lost, {sent} bytes of state sent in all"
    return line
