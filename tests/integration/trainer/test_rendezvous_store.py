"""The rendezvous store of an elastic job (issue 42, item 3): a process of its own that torch's own ``c10d``
rendezvous uses and that an agent waits for, saying so; once the job's agents have closed the rendezvous,
a node that comes late (its pod waited for capacity) ends at once, successfully, through the real
launcher, instead of failing a job it never took part in."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from ddp_trainer import contract
from ddp_trainer.launch import agent as launcher
from ddp_trainer.launch import store
from helpers.operator_process import free_port


def _serve(port: int) -> subprocess.Popen[str]:
    code = f"from ddp_trainer.launch import store; store.serve({port}, '127.0.0.1')"
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_a_node_that_comes_after_the_job_ended_ends_at_once_and_successfully(tmp_path: Path) -> None:
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    port = free_port()
    server = _serve(port)
    try:
        assert store.wait_for("127.0.0.1", port, timeout=60), "the store never answered"
        params = RendezvousParameters(
            backend="c10d",
            endpoint=f"127.0.0.1:{port}",
            run_id="attempt-1",
            min_nodes=1,
            max_nodes=2,
            is_host=False,
            last_call_timeout=1,
        )
        handler = get_rendezvous_handler(params)
        assert handler.next_rendezvous().world_size == 1  # the job trained at a world of one
        assert handler.shutdown()  # and ended: torchrun closes the rendezvous
        script = tmp_path / "train.py"
        script.write_text("print('the late node trained')\n")
        env = {
            **os.environ,
            contract.RDZV_STORE_ENV: contract.RDZV_STORE_EXTERNAL,
            contract.PET_RDZV_ENDPOINT: f"127.0.0.1:{port}",
            contract.PET_RDZV_BACKEND: contract.RDZV_BACKEND,
            contract.PET_RDZV_ID: "attempt-1",
            "PET_NNODES": "1:2",
            "PET_NPROC_PER_NODE": "1",
            contract.PET_NODE_RANK: "1",
            contract.PET_LOCAL_ADDR: "127.0.0.2",
        }
        late = subprocess.run(
            [sys.executable, "-m", "ddp_trainer.launch", str(script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        server.kill()
    said = late.stdout + late.stderr
    assert late.returncode == 0, said[-3000:]
    assert launcher.LATE_JOINER in said and "the late node trained" not in said, said[-3000:]


def test_an_agent_waits_for_a_store_saying_so_and_gives_up_at_its_bound() -> None:
    said: list[str] = []
    port = free_port()  # nothing listens there
    started = time.monotonic()
    assert not store.wait_for("127.0.0.1", port, timeout=1.5, say=said.append)
    assert time.monotonic() - started < 10
    assert said and "did not answer in 2 s" in said[-1] and "-rdzv" in said[-1], said


def test_only_an_elastic_pod_waits_for_an_external_store() -> None:
    env = {
        contract.RDZV_STORE_ENV: contract.RDZV_STORE_EXTERNAL,
        contract.PET_RDZV_ENDPOINT: "job-1-r.job:29500",
    }
    assert store.endpoint(env) == ("job-1-r.job", 29500)
    assert store.endpoint({contract.PET_RDZV_ENDPOINT: "job-1-0.job:29500"}) is None


def test_nodes_gather_at_the_store_before_the_first_round_and_a_late_one_goes_on_at_once() -> None:
    """Three nodes of a job of 3: the first two wait at the store until the third comes, then all go
    together (the first round's joins land within its short last call). A node that comes after (a
    replacement) goes on at once; a job of 4 whose fourth never comes goes on after the bound, saying so."""
    port = free_port()
    server = _serve(port)
    try:
        assert store.wait_for("127.0.0.1", port, timeout=60), "the store never answered"
        went: dict[int, float] = {}
        said: list[str] = []

        def node(index: int) -> None:
            store.gather("127.0.0.1", port, nodes=3, say=said.append)
            went[index] = time.monotonic()

        first = [threading.Thread(target=node, args=(i,)) for i in range(2)]
        for thread in first:
            thread.start()
        time.sleep(1.5)
        assert not went, "the first two wait for the third"
        came = time.monotonic()
        node(2)
        for thread in first:
            thread.join(10)
        assert sorted(went) == [0, 1, 2] and all(when - came < 1.0 for when in went.values()), went
        late = time.monotonic()
        assert store.gather("127.0.0.1", port, nodes=3) == 4 and time.monotonic() - late < 1.0
        assert store.gather("127.0.0.1", port, nodes=6, timeout=0.5, say=said.append) == 5
        assert said[-1].startswith("ddpjob: 5 of 6 nodes came to the rendezvous store in 0 s"), said
    finally:
        server.kill()
