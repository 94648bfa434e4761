"""The rendezvous store of an elastic job (issue 42, item 3): a process of its own that torch's own ``c10d``
rendezvous uses, that an agent waits for (saying so) and that ends by itself once the agents close the
rendezvous, so the pod that runs it in a cluster does not outlive its job."""

from __future__ import annotations

import subprocess
import sys
import time

from ddp_trainer import contract
from ddp_trainer.launch import store
from helpers.operator_process import free_port


def _serve(port: int, run_id: str) -> subprocess.Popen[str]:
    code = f"from ddp_trainer.launch import store; store.serve({port}, '127.0.0.1', {run_id!r}, linger=0.5)"
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_the_store_serves_torchs_rendezvous_and_ends_once_the_agents_close_it() -> None:
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    port = free_port()
    server = _serve(port, "attempt-1")
    try:
        assert store.wait_for("127.0.0.1", port, timeout=60), "the store never answered"
        params = RendezvousParameters(
            backend="c10d",
            endpoint=f"127.0.0.1:{port}",
            run_id="attempt-1",
            min_nodes=1,
            max_nodes=1,
            is_host=False,
            last_call_timeout=1,
        )
        handler = get_rendezvous_handler(params)
        info = handler.next_rendezvous()
        assert info.world_size == 1
        time.sleep(3 * store.POLL_SECONDS)
        assert server.poll() is None, "the store ended while its rendezvous was open"
        assert handler.shutdown()  # what torchrun does when its workers have ended
        out, _ = server.communicate(timeout=10 * store.POLL_SECONDS)
    finally:
        server.kill()
    assert server.returncode == 0, out
    assert "rendezvous attempt-1 is closed" in out, out


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
