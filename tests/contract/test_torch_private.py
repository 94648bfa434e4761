"""torch's private parts that the launcher reads or wraps (launch/agent.py, launch/store.py), checked for
what is read of them, not only that the name exists: a torch that renames or reshapes one fails here,
naming it, before an elastic job fails in production. Each check builds the real object (a real TCPStore,
torch's own rendezvous handler) and reads it the way the launcher does."""

from __future__ import annotations

import inspect
import pickle
import socket
from datetime import UTC, datetime, timedelta

from testcluster.ci import skip_or_fail

try:
    import torch
except ImportError as error:
    skip_or_fail(f"the trainer's half needs torch (the venv has it): {error}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_rendezvous_state_has_the_fields_the_launcher_reads_and_pickles() -> None:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

    state = _RendezvousState()
    node = _NodeDesc("host-a", 7, 0)
    state.participants[node] = 0
    state.last_heartbeats[node] = datetime.now(UTC)
    copy = pickle.loads(pickle.dumps(state))
    for field, kind in {
        "round": int,
        "complete": bool,
        "closed": bool,
        "participants": dict,
        "last_heartbeats": dict,
    }.items():
        assert isinstance(getattr(copy, field), kind), (
            f"_RendezvousState.{field} is no longer a {kind.__name__}"
        )
    (only,) = copy.participants
    assert (only.addr, only.pid) == ("host-a", 7), "_NodeDesc no longer carries addr and pid"
    assert only in copy.last_heartbeats, "_NodeDesc no longer hashes as the launcher compares it"


def test_the_c10d_handler_exposes_its_store_settings_node_and_state() -> None:
    from torch.distributed import TCPStore  # type: ignore[attr-defined]
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        create_handler,
    )

    port = _free_port()
    host = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    client = TCPStore(
        "127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    params = RendezvousParameters(
        "c10d", f"127.0.0.1:{port}", "contract", 1, 2, keep_alive_interval=1, keep_alive_max_attempt=5
    )
    backend = C10dRendezvousBackend(client, "contract")
    handler = create_handler(client, backend, params)
    assert isinstance(handler, DynamicRendezvousHandler)
    settings = handler._settings
    assert settings.run_id == "contract", "DynamicRendezvousHandler._settings.run_id"
    bound = settings.keep_alive_interval * settings.keep_alive_max_attempt
    assert bound == timedelta(seconds=5), (
        "the keep-alive bound (interval × max attempts) is read as a timedelta"
    )
    assert handler._store is client, "DynamicRendezvousHandler._store is the rendezvous store"
    assert hasattr(handler._this_node, "addr") and hasattr(handler._this_node, "pid"), "_this_node"
    assert handler._state_holder._backend is backend, "_state_holder._backend (the launcher reconnects it)"
    assert (client.host, client.port) == ("127.0.0.1", port) and client.timeout == timedelta(seconds=10)
    assert DynamicRendezvousHandler.num_nodes_waiting.__code__.co_argcount == 1, "num_nodes_waiting(self)"
    state = handler._state_holder.state
    assert {"round", "participants", "last_heartbeats"} <= set(vars(state)), "_state_holder.state"
    # the launcher's own read of the stored state, and its compare-and-set write (launch/store.drop)
    handler._state_holder.mark_dirty()
    handler._state_holder.sync()
    got = C10dRendezvousBackend(client, "contract").get_state()
    assert got is not None and isinstance(pickle.loads(got[0]), type(state))
    written = backend.set_state(got[0], got[1])
    assert written is not None and len(written) == 3 and written[2], "set_state returns (state, token, ok)"
    del host


def test_the_agent_methods_the_launcher_wraps_keep_their_signatures() -> None:
    from torch.distributed.elastic.agent.server.api import RunResult, SimpleElasticAgent, WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    for owner, method in ((LocalElasticAgent, "_monitor_workers"), (SimpleElasticAgent, "_rendezvous")):
        params = list(inspect.signature(getattr(owner, method)).parameters)
        assert params == ["self", "worker_group"], f"{owner.__name__}.{method}{params}"
    assert "_remaining_restarts" in inspect.getsource(SimpleElasticAgent.__init__), "_remaining_restarts"
    run_loop = inspect.getsource(SimpleElasticAgent._invoke_run)
    assert "self._monitor_workers(" in run_loop and "self._remaining_restarts -= 1" in run_loop, (
        "SimpleElasticAgent._invoke_run no longer restarts through _monitor_workers and _remaining_restarts"
    )
    assert {"state", "failures"} <= set(inspect.signature(RunResult).parameters), "RunResult(state, failures)"
    assert {"HEALTHY", "FAILED", "UNHEALTHY"} <= set(WorkerState.__members__), "WorkerState"
    # the rank assignment's wait is the store read that times out when a member goes silent as a round forms
    assigned = inspect.getsource(SimpleElasticAgent._assign_worker_ranks)
    assert "role_info" in assigned.lower() or "ROLE_INFO_PREFIX" in assigned, "_assign_worker_ranks"
    assert issubclass(torch.distributed.DistStoreError, RuntimeError), "torch.distributed.DistStoreError"


def test_the_c10d_backend_reads_the_read_timeout_the_elastic_conf_sets() -> None:
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend

    from ddp_trainer import contract

    assert "read_timeout=" in contract.ELASTIC_RDZV_CONF
    assert '"read_timeout"' in inspect.getsource(c10d_rendezvous_backend._create_tcp_store), (
        "c10d's _create_tcp_store no longer reads read_timeout from the rendezvous configuration"
    )
