"""A heal without a restart, with real processes (issue 57 item 1's groundwork, ``core.reform``): 3 gloo
ranks train under DDP; one is SIGKILLed; the two survivors re-form their group in place at world 2 (same
pids), wrap DDP again around the same module and train on, bit-identical; a new process joins (world 3),
copies rank 0's model and optimizer state over the new group, and all three train on bit-identical."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from helpers.torchrun_helpers import HERE, reaped

pytestmark = pytest.mark.slow

WAIT = timedelta(seconds=60)


def _spawn(out: Path, port: int, role: str, rank: int) -> subprocess.Popen[bytes]:
    log = (out / f"{role}{rank}.log").open("wb")
    argv = [sys.executable, str(HERE / "reform_scenarios.py"), role, str(rank), str(port), str(out)]
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


def _wait(store: dist.TCPStore, keys: list[str], procs: list[subprocess.Popen[bytes]]) -> None:
    """Until the workers set ``keys``; fails at once when one of them ends before."""
    deadline = time.monotonic() + WAIT.total_seconds()
    while not store.check(keys):
        ended = [p.args for p in procs if p.poll() is not None and p.returncode != -signal.SIGKILL]
        assert not ended and time.monotonic() < deadline, f"waiting for {keys}: ended {ended}"
        time.sleep(0.05)


def _logs(out: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(out.glob("*.log")))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    out = tmp_path_factory.mktemp("reform")
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False, timeout=WAIT)  # type: ignore[attr-defined]
    procs = [_spawn(out, store.port, "first", rank) for rank in range(3)]
    with reaped(procs, lambda: _logs(out)):
        _wait(store, [f"trained{r}" for r in range(3)], procs)
        os.kill(procs[2].pid, signal.SIGKILL)
        procs[2].wait(10)
        store.set("lost", "2")
        _wait(store, ["shrunk0", "shrunk1"], procs)
        procs.append(_spawn(out, store.port, "joiner", 0))
        store.set("grow", "1")
        codes = [p.wait(WAIT.total_seconds()) for p in procs]
    assert codes == [0, 0, -signal.SIGKILL, 0], _logs(out)
    records: dict[str, dict[str, Any]] = {}
    for path in out.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            records[f"{path.stem}.{entry['phase']}"] = entry
    yield {"records": records, "pids": [p.pid for p in procs], "logs": _logs(out)}


def _same(records: dict[str, Any], *keys: str, parts: tuple[str, ...] = ("model", "optim")) -> None:
    """The ranks' parameters and optimizer state (and ``parts`` else) are bit-identical."""
    digests = {tuple(records[k][part] for part in parts) for k in keys}
    assert len(digests) == 1, {k: [records[k][part][:12] for part in parts] for k in keys}


def test_the_survivors_keep_their_processes(run: dict[str, Any]) -> None:
    r = run["records"]
    for rank in (0, 1):
        pids = {r[f"first{rank}.{phase}"]["pid"] for phase in ("trained", "shrunk", "grown", "stepped")}
        assert pids == {run["pids"][rank]}


def test_the_survivors_reform_at_world_2_and_train_on_bit_identical(run: dict[str, Any]) -> None:
    r = run["records"]
    _same(r, "first0.trained", "first1.trained", "first2.trained")
    assert [(r[f"first{k}.shrunk"]["rank"], r[f"first{k}.shrunk"]["world"]) for k in (0, 1)] == [
        (0, 2),
        (1, 2),
    ]
    assert all(r[f"first{k}.shrunk"]["failed"] for k in (0, 1)), "the step in flight did not fail"
    _same(r, "first0.shrunk", "first1.shrunk")
    assert r["first0.shrunk"]["model"] != r["first0.trained"]["model"], "no step at world 2"
    assert "re-forming the process group (old one aborted): rank 1 of 2" in run["logs"]


def test_a_joiner_takes_the_state_from_rank_0_over_the_new_group(run: dict[str, Any]) -> None:
    r = run["records"]
    before, copied = r["joiner0.before_copy"], r["first0.grown"]
    assert (before["rank"], before["world"]) == (2, 3)
    assert before["model"] != copied["model"] and before["optim"] != copied["optim"], "the joiner was a copy"
    _same(r, "first0.grown", "first1.grown", "joiner0.grown", parts=("model", "buffers", "optim"))
    assert copied["model"] == r["first0.shrunk"]["model"], "the survivors' state changed in the copy"
    assert r["joiner0.grown"]["bytes"] == copied["bytes"] > 0


def test_all_three_train_on_bit_identical(run: dict[str, Any]) -> None:
    _same(run["records"], "first0.stepped", "first1.stepped", "joiner0.stepped")
