"""Launch the trainer (or a script) the way a pod does: torchrun, one process per "node", on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parent


@contextlib.contextmanager
def reaped(
    procs: list[subprocess.Popen[bytes]],
    logs: Any,
    *,
    trees: bool = False,
    beside: tuple[subprocess.Popen[bytes], ...] = (),
) -> Any:
    """Run a scenario of real processes: an error in it is an AssertionError with ``logs()`` (their logs),
    and every process still running at the end, of ``procs`` (as the scenario left the list) and
    ``beside`` (a store server), is killed (``trees``: with its descendants, a launcher's workers) and
    reaped, whatever happened."""
    try:
        yield
    except Exception as e:
        raise AssertionError(f"{type(e).__name__}: {e}\n{logs()}") from e
    finally:
        for p in [*procs, *beside]:
            if p.poll() is None:
                for pid in process_tree(p.pid) if trees else [p.pid]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                p.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Node:
    rank: int
    proc: subprocess.Popen[bytes]
    log: Path
    termination_log: Path
    metrics_port: int


@dataclass
class Launch:
    nodes: list[Node] = field(default_factory=list)

    def wait(self, timeout: float = 180) -> list[int]:
        deadline = time.monotonic() + timeout
        codes = []
        for node in self.nodes:
            try:
                codes.append(node.proc.wait(max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"torchrun did not finish in {timeout}s:\n{self.logs()}") from None
        return codes

    def running(self) -> bool:
        return any(n.proc.poll() is None for n in self.nodes)

    def kill(self) -> None:
        """SIGKILL every process of every node, as when a pod's containers are killed (torchrun starts
        each worker in a session of its own, so the launcher's process group is not enough)."""
        pids = [pid for node in self.nodes if node.proc.poll() is None for pid in process_tree(node.proc.pid)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for node in self.nodes:
            node.proc.wait()

    def terminate(self) -> None:
        """SIGTERM the launcher only, as the kubelet does to a container's main process."""
        for node in self.nodes:
            node.proc.send_signal(signal.SIGTERM)

    def report(self, node: int = 0) -> dict[str, Any]:
        path = self.nodes[node].termination_log
        assert path.exists(), f"no termination message at {path}:\n{self.logs()}"
        data: dict[str, Any] = json.loads(path.read_text())
        return data

    def logs(self) -> str:
        return "\n".join(
            f"--- node {n.rank} ---\n{n.log.read_text(errors='replace')[-6000:]}" for n in self.nodes
        )


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants, from /proc (a launcher, its fork server, its workers)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def launch(
    workdir: Path,
    target: list[str],
    *,
    nnodes: int = 2,
    nproc: int = 2,
    env: dict[str, str] | None = None,
    per_node: list[dict[str, str]] | None = None,
) -> Launch:
    """Start ``nnodes`` torchrun agents with ``nproc`` workers each; ``target`` follows torchrun's options;
    ``per_node[k]``: variables of node k alone (its pod's ``HOSTNAME``, ``DDPJOB_NODE_NAME``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    master = free_port()
    result = Launch()
    for k in range(nnodes):
        node_env = {
            key: value for key, value in os.environ.items() if not key.startswith(("PROMETHEUS_", "DDPJOB_"))
        }
        node_env.update(
            # absolute: the launchers run in ``workdir``, where a relative entry would find nothing
            PYTHONPATH=os.pathsep.join(
                [
                    str(HERE),
                    *(os.path.abspath(p) for p in node_env.get("PYTHONPATH", "").split(os.pathsep) if p),
                ]
            ),
            OMP_NUM_THREADS="1",
            DDPJOB_NAME="testjob",
            DDPJOB_NAMESPACE="testns",
            DDPJOB_METRICS_PORT=str(free_port()),
            DDPJOB_TERMINATION_LOG=str(workdir / f"termination-{k}.json"),
            TMPDIR=str(workdir / f"tmp-{k}"),  # the node's own /tmp, as a pod's: nothing left in the host's
        )
        (workdir / f"tmp-{k}").mkdir(exist_ok=True)
        node_env.update(env or {})
        node_env.update((per_node or [{}] * nnodes)[k])
        log = workdir / f"node-{k}.log"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--node-rank", str(k)]
        cmd += ["--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(master)]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd + target,
                env=node_env,
                cwd=workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        term = Path(node_env["DDPJOB_TERMINATION_LOG"])
        result.nodes.append(Node(k, proc, log, term, int(node_env["DDPJOB_METRICS_PORT"])))
    return result


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]] | None:
    """``{sample name: [(labels, value)]}`` from ``/metrics`` on ``port``, or None if nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return None
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def by_rank(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> dict[str, float]:
    return {labels["rank"]: value for labels, value in samples.get(name, [])}


def checkpoints(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("step-*.pt")) if directory.is_dir() else []
