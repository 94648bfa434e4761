"""The launcher's pure decisions: which failed rank is the cause, which exit codes are never restarted in
place, and the state it hands its workers. (The real agent: tests/integration/local/test_run.py.)"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ddp_trainer import contract
from ddp_trainer.core import inplace
from ddp_trainer.launch import agent, warm
from ddp_trainer.launch.book import Book

GLOO_RESET = "RuntimeError: [pair.cc:545] Read error [127.0.0.1]:3479: Connection reset by peer."


def test_a_killed_rank_is_the_cause_not_the_peers_that_lost_it() -> None:
    failures = {0: (1, GLOO_RESET), 1: (-9, "Signal 9 (SIGKILL) received by PID 7"), 2: (-15, "")}
    assert inplace.cause(failures) == "rank 1 killed by signal 9 (and 2 more rank(s) on this node)"


def test_a_ranks_own_error_beats_a_collateral_one_and_a_traceback_says_its_last_line() -> None:
    own = "Traceback (most recent call last):\n  File x\nValueError: bad batch"
    assert inplace.cause({0: (1, GLOO_RESET), 3: (1, own)}) == (
        "rank 3 exited 1: ValueError: bad batch (and 1 more rank(s) on this node)"
    )
    assert inplace.cause({}) == contract.OTHER_NODE_FAILED


def test_causes_across_pods_are_ranked_the_same_way() -> None:
    causes = [contract.OTHER_NODE_FAILED, "rank 0 exited 1: " + GLOO_RESET, "rank 3 killed by signal 9"]
    assert min(causes, key=contract.blame) == "rank 3 killed by signal 9"
    assert min(causes[:2], key=contract.blame).startswith("rank 0 exited 1")


@pytest.mark.parametrize(
    ("codes", "expected"), [([1, -9], None), ([1, 78], 78), ([2], 2), ([86, 1], 86), ([143], 143)]
)
def test_configuration_divergence_and_sigterm_codes_are_never_restarted_in_place(
    codes: list[int], expected: int | None
) -> None:
    assert inplace.not_retried(codes) == expected
    assert inplace.exit_code_of(dict(enumerate(codes))) == (expected or 1)


def test_the_state_round_trips_and_a_missing_or_broken_one_is_a_fresh_start(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    inplace.write_state(path, inplace.LaunchState(2, "rank 1 killed by signal 9", 12.5))
    env = {contract.LAUNCH_STATE_ENV: str(path)}
    assert inplace.read_state(env) == inplace.LaunchState(2, "rank 1 killed by signal 9", 12.5)
    assert inplace.read_state({}) == inplace.LaunchState()
    path.write_text("{not json")
    assert inplace.read_state(env) == inplace.LaunchState()


def test_node_rank_0_hosts_the_rendezvous_unless_the_user_says_otherwise() -> None:
    c10d = {contract.PET_RDZV_BACKEND: "c10d"}
    assert agent.rendezvous_host({**c10d, contract.PET_NODE_RANK: "0"}) == {
        "PET_RDZV_CONF": f"is_host=1,{contract.RIGID_RDZV_CONF}"
    }
    assert agent.rendezvous_host({**c10d, contract.PET_NODE_RANK: "3"}) == {
        "PET_RDZV_CONF": f"is_host=0,{contract.RIGID_RDZV_CONF}"
    }
    assert agent.rendezvous_host({**c10d, contract.PET_NODE_RANK: "0", "PET_RDZV_CONF": "x=1"}) == {}
    assert agent.rendezvous_host({contract.PET_NODE_RANK: "0"}) == {}
    elastic = {**c10d, contract.PET_NODE_RANK: "1", "PET_NNODES": "1:2"}
    assert agent.rendezvous_host(elastic) == {"PET_RDZV_CONF": f"is_host=0,{contract.ELASTIC_RDZV_CONF}"}


def test_a_workers_interrupted_exit_unsignalled_is_another_nodes_stop_only_in_an_elastic_job(
    tmp_path: Path,
) -> None:
    """The trainer's stop flag stops every rank at the step boundary where one node's pod left (its
    kubelet's SIGTERM) or its agent stopped for a grow; the other agents, not signalled themselves, see
    their workers exit 143. Elastic: that is a resize (re-rendezvous); rigid: a stop, no restart."""
    elastic = Book(tmp_path / "e.json", elastic=True)
    rigid = Book(tmp_path / "r.json", elastic=False)
    assert elastic.peer_stopped(contract.INTERRUPTED_EXIT_CODE) is True
    assert rigid.peer_stopped(contract.INTERRUPTED_EXIT_CODE) is False
    assert elastic.peer_stopped(1) is False, "a crash is a failure, restarted as one"
    assert elastic.peer_stopped(None) is False


def test_the_fork_server_preloads_what_a_workers_first_optimizer_imports() -> None:
    # issue 54: torch._dynamo, imported by the first optimizer of every new world's workers (torch's
    # _disable_dynamo around Optimizer.__init__), took 3.3-3.6 s of each world's start on two loaded cores;
    # the fork server imports it once, and initializes no CUDA doing so (its forks could not use it)
    code = (
        "import sys, torch\n"
        f"for name in {warm.PRELOAD!r}: __import__(name)\n"
        "before = set(sys.modules)\n"
        "torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())\n"
        "print(sorted(name for name in set(sys.modules) - before if name.startswith('torch._')))\n"
        "print(torch.cuda.is_initialized())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["[]", "False"], done.stdout


_JOINS = """
import sys, time
from ddp_trainer.launch import warm

said = []
warm.before_joining(2, said.append)  # no warm fork server (a user's script): nothing
warm.start_fork_server()
warm.before_joining(0, said.append)  # no world trains (every node starts): nothing
started = time.monotonic()
warm.before_joining(2, said.append)  # a world trains: this node joins it
print(repr(said), file=sys.stderr)
print(time.monotonic() - started)
"""


def test_a_node_that_joins_a_running_world_waits_for_its_warm_fork_server_before_it_asks_to_join() -> None:
    """A joiner's workers start after the round it joins, while the world is paused for it; its fork server
    imports torch first (seconds): it waits for that before it meets the rendezvous (warm.before_joining),
    saying so. A node that starts with the others, or runs no warm fork server, does not wait."""
    done = subprocess.run([sys.executable, "-c", _JOINS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    said = done.stderr.strip().splitlines()[-1]
    assert said.count("this node joins it once its workers can start at once") == 1, said
    assert "a world of 2 node(s) trains" in said and "the fork server is ready after" in said, said
    assert float(done.stdout.strip()) > 0.2  # it waited for torch's import in the fork server


class _Writes(io.RawIOBase):
    """A file that records each write the OS would get."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.writes.append(bytes(data))
        return len(data)


def test_a_launcher_line_reaches_the_pods_log_in_one_write() -> None:
    """Under PYTHONUNBUFFERED (the pods'), stderr writes through: a print's text and its newline are two
    writes, and a worker's line landed between them; the launcher makes its stderr line-buffered."""
    raw = _Writes()
    stream = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)  # what PYTHONUNBUFFERED gives
    print("before", file=stream, flush=True)
    assert raw.writes == [b"before", b"\n"]  # the defect, as Python does it
    raw.writes.clear()
    inplace.whole_lines(stream)
    print("[launcher] healed in place into round 1", file=stream, flush=True)
    print("and another", file=stream)  # no flush asked: the newline flushes it
    assert raw.writes == [b"[launcher] healed in place into round 1\n", b"and another\n"], raw.writes
    inplace.whole_lines(object())  # not a text stream: left as it is


class _Watch:
    """The silence watch of a node dropped from its round while it was frozen (what the store's state says
    once it wakes); counts its looks."""

    reconnects = 0

    def __init__(self) -> None:
        self.polls: list[bool] = []

    def poll(self, force: bool = False, starting: Any = bool) -> Any:
        from ddp_trainer.launch import silence

        self.polls.append(force)
        return silence.Verdict(silence.DROPPED, ("pod-1",), 0.0)


def test_a_woken_dropped_nodes_worker_that_asks_to_heal_is_stopped_not_healed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A node frozen (SIGSTOP) past the bound is dropped; the others shut their connections to it down and
    heal. Woken, its stale worker finds its collective failed and marks itself heal-wanted, maybe before its
    launcher's watch looked. The launcher asks the watch first: dropped, so it stops the worker and meets the
    others as a new node (a heal would meet them as a survivor steps behind, refused, a restart)."""
    from torch.distributed.elastic.agent.server.api import RunResult, SimpleElasticAgent, WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    from ddp_trainer.core import notice
    from ddp_trainer.launch import workers

    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (tmp_path / f"{workers.WORKER_MARK_PREFIX}{worker.pid}").write_text(notice.HEAL_WANTED)

        def looked(_agent: object, _group: object) -> RunResult:
            if worker.poll() is None:
                return RunResult(state=WorkerState.HEALTHY)
            return RunResult(state=WorkerState.FAILED)

        for cls, name in (
            (LocalElasticAgent, "_monitor_workers"),
            (SimpleElasticAgent, "_rendezvous"),
            (SimpleElasticAgent, "_restart_workers"),
            (DynamicRendezvousHandler, "num_nodes_waiting"),
        ):
            monkeypatch.setattr(cls, name, getattr(cls, name))  # put back after the test
        monkeypatch.setattr(LocalElasticAgent, "_monitor_workers", looked)
        book = Book(tmp_path / "launch.json", elastic=True)
        agent._install(book, workers.Marks(tmp_path, builtin=True), tmp_path / notice.NOTICE_FILE)
        launcher = type("Agent", (), {})()
        launcher._ddpjob_silence = watch = _Watch()
        launcher._remaining_restarts = 0
        group = type("Group", (), {})()
        group.workers = [type("Worker", (), {"id": worker.pid, "local_rank": 0, "global_rank": 1})()]

        result = LocalElasticAgent._monitor_workers(launcher, group)  # type: ignore[arg-type]
        assert worker.wait(timeout=10) == -9  # stopped (SIGKILL), not healed
        assert result.state == WorkerState.FAILED and watch.polls[0] is True
        said = capsys.readouterr().err
        assert "this node was dropped from its round as silent" in said, said
        assert "healing" not in said, said
        assert book.pending is not None and "dropped" in book.pending[0], book.pending
    finally:
        worker.kill()
        worker.wait()
