"""``python -m ddp_trainer.launch [torchrun args]``: torchrun, running its own elastic agent, with
five additions.

torchrun's agent (``--max-restarts``, which the operator sets as ``PET_MAX_RESTARTS``) restarts every local
worker when one fails, and with the ``c10d`` rendezvous (``PET_RDZV_BACKEND``) every other node's agent
sees the re-opened rendezvous and restarts its workers too: the whole gang restarts in the same pods and
resumes from the last checkpoint. This launcher adds:

1. **No retry for what a retry cannot fix.** The agent restarts on any worker failure; a worker that exits
   with one of :data:`contract.NOT_RETRIED_EXIT_CODES` (2 usage, 78 refused checkpoint, 86 divergence under
   ``Fail``) takes the agent's remaining restarts away, so the agent stops, and the launcher exits with that
   code: the pod fails with it, the Job's ``podFailurePolicy`` and the operator's policy see it.
2. **Bookkeeping the operator reads.** Each gang restart this pod's agent does is counted, with its cause
   (the failing rank, its exit code and its first error, as torch's error file or the signal says; "a rank
   on another node failed" on the other pods), in the JSON file :data:`contract.LAUNCH_STATE_ENV` names.
   The restarted workers read it (:func:`ddp_trainer.core.inplace.read_state`) into ``ddp_restarts_in_place``,
   ``ddp_last_restart_info`` and their report, so the operator learns of every restart from the pods.

3. **Warm restarts for the built-in trainer.** ``--module ddp_trainer`` (the image's default) runs as a
   function entrypoint under the ``forkserver`` start method, with torch pre-imported in the fork server
   (:data:`.warm.PRELOAD`): each worker, the first ones and those of every restart in place, is a fork of a
   process that has already paid Python's and torch's start (about 1.5 s per worker on two busy cores,
   most of what a restart in place costs). A user's script or module keeps torchrun's own way: a new
   interpreter per worker, in which the no-code hook's exit handlers run.

4. **A resize is not a restart.** After an elastic job's rendezvous has fewer nodes than the last one (a
   peer was lost, or its pod left at a step boundary) or more (one joined), the restart is a resize: it is
   not counted, and torch's restart it spent is given back; with none left, an elastic job's agent is lent
   one to find out at the rendezvous, and gives up if the world did not change.

5. **A silent peer is a lost peer.** An elastic agent watches its round's rendezvous keep-alives
   (:mod:`ddp_trainer.launch.silence`, read by :mod:`ddp_trainer.launch.rounds`): a member frozen or cut off
   (its sockets open, so no collective fails) is judged silent after the keep-alive bound, and the agent
   stops its own workers, stuck in a collective with it, and meets the next round without it; a member
   dropped that wakes stops its stale workers and joins like a new node. A round whose rank assignment
   times out (a member went silent as it formed) is met again.

The agent's methods are wrapped, not replaced (``_monitor_workers`` of ``LocalElasticAgent`` and
``_rendezvous`` of ``SimpleElasticAgent``, the same since torch 1.9; ``tests/contract/test_torch_private.py``
checks what is read of them); ``tests/integration/local/test_run.py`` runs the real thing. The pure parts
(the state, causes and exit codes) are :mod:`ddp_trainer.core.inplace`, which the trainer's modules import;
this module imports the trainer (its workers run it), never the other way round. Long because it wraps
torch's agent in one place: each addition sits beside the others it meets in the same two wrapped methods.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ddp_trainer import contract
from ddp_trainer.core import notice
from ddp_trainer.core.config import termination_log
from ddp_trainer.core.inplace import SAME, exit_code_of, not_retried, whole_lines
from ddp_trainer.launch import heal_meeting, heal_round, silence, store, warm, workers
from ddp_trainer.launch.book import Book
from ddp_trainer.launch.outage import POLL_SECONDS, StoreWait, reach
from ddp_trainer.launch.rounds import InFlight, RoundWatch, bounded_waiting, patient, stop_now
from ddp_trainer.launch.warm import runs_builtin, warm_config_from_args, warm_failure_path
from ddp_trainer.reporting.report import record_failure

log = logging.getLogger("ddp_trainer.launch")


def rendezvous_host(env: Mapping[str, str]) -> dict[str, str]:
    """Node rank 0 hosts the ``c10d`` rendezvous store, the others connect to it: said explicitly
    (``is_host``), since torch would guess it from whether the endpoint's name resolves to this machine, which
    pods that share a host (``ddpjob local``) or whose hostname is not the endpoint's name can get wrong.
    An elastic job's (``PET_NNODES`` ``min:max``) gets :data:`contract.ELASTIC_RDZV_CONF`'s timing, so a
    lost node is dropped in seconds. Nothing when the user set ``PET_RDZV_CONF`` or the rendezvous is not
    ``c10d``."""
    node = env.get(contract.PET_NODE_RANK, "").strip()
    if env.get(contract.RDZV_STORE_ENV) == contract.RDZV_STORE_EXTERNAL and "PET_RDZV_CONF" not in env:
        return {"PET_RDZV_CONF": f"is_host=0,{contract.ELASTIC_RDZV_CONF}"}
    if (
        env.get(contract.PET_RDZV_BACKEND) != contract.RDZV_BACKEND
        or "PET_RDZV_CONF" in env
        or not node.isdigit()
    ):
        return {}
    elastic = ":" in env.get("PET_NNODES", "")  # min:max
    timing = f",{contract.ELASTIC_RDZV_CONF}" if elastic else f",{contract.RIGID_RDZV_CONF}"
    return {"PET_RDZV_CONF": f"is_host={1 if int(node) == 0 else 0}{timing}"}


LATE_JOINER = (
    "ddpjob: this attempt's rendezvous is closed: the elastic job ended (at a smaller world) before this "
    "node joined; nothing is left for it to do (exit 0)"
)
"""An elastic job's pod that starts after the others ended the job (it waited for capacity, say): the
Indexed Job completes only when every index has, so it ends at once, successfully, instead of failing the
job it never took part in."""

CLOSED_UNDER = (
    "ddpjob: another node's agent gave up and closed this elastic job's rendezvous while this node was in "
    "it: the attempt failed (exit 1), not finished"
)
"""A node that trained and then finds the rendezvous closed: the job did not end, another node failed it
(torchrun's agent closes the rendezvous when it gives up). Only a node that never joined a round is a late
joiner (:data:`LATE_JOINER`)."""


def _ended(agent: Any, group: Any) -> dict[int, tuple[int, str]]:
    """``{global rank: (exit code, message)}`` of every local worker that ended non-zero, where the agent's
    process context is torchrun's multiprocessing one (the built-in trainer's), which names only the first
    failure it notices (often a rank that lost its peer, not the one that died)."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    context = getattr(agent, "_pcontext", None)
    processes = getattr(getattr(context, "_pc", None), "processes", None) or ()
    error_files = getattr(context, "error_files", None) or {}
    found = {}
    for worker, process in zip(sorted(group.workers, key=lambda w: w.local_rank), processes, strict=False):
        if process.exitcode:
            error_file = error_files.get(worker.local_rank, "")
            failure = ProcessFailure(worker.local_rank, process.pid, process.exitcode, error_file)
            found[worker.global_rank] = (process.exitcode, failure.message)
    return found


def _fail_rigid(agent: Any, group: Any, why: str) -> None:
    """A rigid job's pod whose peer went silent: no restart in place (the round would wait for the silent
    node), so the agent gives up, the pod fails and the operator restarts the gang as a new attempt. The
    cause goes in the pod's report, so the status names the silent pod."""
    heal_round.say(
        "a rigid job cannot train without it: this pod fails now, and the gang restarts from the last "
        "checkpoint as a new attempt (spec.maxRestarts)"
    )
    agent._remaining_restarts = 0
    first = min((int(worker.global_rank) for worker in group.workers), default=0)
    record_failure(termination_log(os.environ), first, f"{contract.SILENT_PEER}: {why}")
    handler = group.spec.rdzv_handler
    handler.shutdown = bounded(handler.shutdown, SHUTDOWN_SECONDS)


SHUTDOWN_SECONDS = 5.0
"""How long a failing rigid pod's agent gives torch's rendezvous shutdown (it closes the round in the store,
which a silent store host never answers) before its process ends anyway."""


def bounded(call: Any, seconds: float) -> Any:
    """``call`` run in a thread of its own, given up after ``seconds`` (False then; else its result)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(Exception):  # a shutdown that fails, as one that hangs, ends nothing here
            done, got = InFlight(seconds).ask(lambda: call(*args, **kwargs))
            return got if done else False
        return False

    return run


ROUND_TRIES = 5
"""How many rounds an elastic agent tries when a round's rank assignment times out (a member went silent
while the round formed) before it gives up."""


def _install(book: Book, marks: workers.Marks, healing: Path | None = None) -> None:
    from torch.distributed import DistNetworkError, DistStoreError
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    monitor, rendezvous = LocalElasticAgent._monitor_workers, SimpleElasticAgent._rendezvous
    notice_at = healing  # issue 57's heal (heal_round): its notice's path; rendezvous_'s `healing` is a flag

    def lend(self: Any) -> None:
        if book.elastic and self._remaining_restarts == 0:
            self._remaining_restarts, book.borrowed = 1, True  # see Book.borrowed

    def round_of(group: Any) -> int:
        handler = group.spec.rdzv_handler
        return handler._state_holder.state.round if isinstance(handler, DynamicRendezvousHandler) else -1

    ways = None if healing is None else heal_round.Healing(monitor, marks, book, healing, round_of)
    watched = (WorkerState.HEALTHY, WorkerState.FAILED, WorkerState.UNHEALTHY)

    def look(self: Any, group: Any, force: bool) -> silence.Verdict | None:
        quiet: RoundWatch | None = getattr(self, "_ddpjob_silence", None)
        if quiet is None:
            return None
        verdict = quiet.poll(force=force, starting=lambda: marks.starting(workers.pids(group)))
        if quiet.reconnects != getattr(self, "_ddpjob_reconnects", 0):
            # the handler's client was renewed: the agent's own store (its exit barrier's) wraps it too,
            # else a run that outlived its store ends in torch's "Error waiting on exit barrier"
            self._ddpjob_reconnects = quiet.reconnects
            self._store = group.spec.rdzv_handler._get_store()
        return verdict

    def monitor_workers(self: Any, group: Any) -> Any:
        result = monitor(self, group)
        verdict = None
        if ways is not None and result.state == WorkerState.HEALTHY:
            if heal_round.wants(group, ways):  # a node dropped while frozen wakes: its stale workers want a
                verdict = look(self, group, force=True)  # heal, but the world went on without it (stop them)
            if verdict is None or verdict.kind != silence.DROPPED:
                verdict = None
                healed = heal_round.when_wanted(self, group, result, ways)
                if healed is not result and healed.state == WorkerState.HEALTHY:
                    return healed  # healed in place; else the silence watch below still looks at them
                result = healed
        if verdict is None and result.state in watched:
            verdict = look(self, group, force=result.state != WorkerState.HEALTHY)
        if verdict is not None:
            lost = verdict.kind == silence.LOST  # the host's process ended: a lost node, not a silent one
            if silenced := heal_round.when_silent(self, group, result, verdict, ways):
                if silenced.state != WorkerState.HEALTHY:
                    lend(self)  # the heal fell back: its workers stopped, the restart's cause booked
                return silenced
            if result.state == WorkerState.HEALTHY:
                stuck = "a collective with a silent peer cannot end"
                if lost:
                    stuck = (
                        "nobody serves the store they wait for"
                        if verdict.host
                        else "they wait for a rank that will not come"
                    )
                heal_round.say(
                    f"{verdict.cause()}; stopping this pod's workers now ({stuck})"
                    + (", and meeting the others at the next round" if book.elastic else "")
                )
                result = stop_now(self, group, monitor)
            failures = {rank: (f.exitcode, f.message) for rank, f in result.failures.items()}
            if not book.elastic:  # a rigid gang cannot train without it: the pod fails, the gang restarts
                _fail_rigid(self, group, verdict.cause())
                book.failed(failures, why=verdict.cause())
                return result
            book.failed(failures, stopped=True, why=verdict.cause(), silent=not lost)
            lend(self)
            return result
        if result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY):
            failures = {rank: (f.exitcode, f.message) for rank, f in result.failures.items()}
            failures = {**_ended(self, group), **failures}
            code = not_retried([code for code, _ in failures.values()])
            stopped = book.peer_stopped(code)
            book.failed(failures, stopped)
            if stopped:
                code = None  # a node leaves at the step boundary, or one joins (see Book.peer_stopped)
            if code is not None and self._remaining_restarts > 0:
                print(
                    f"[launcher] a worker exited {code}, which no restart can fix",
                    file=sys.stderr,
                    flush=True,
                )
                self._remaining_restarts = 0
            elif code is None:
                lend(self)
        return result

    def meet(self: Any, group: Any) -> None:
        """torch's rendezvous; an elastic agent whose round's rank assignment timed out (a member went
        silent while the round formed: torch's ``DistStoreError`` on ``role_info``) meets the next round,
        without it, up to :data:`ROUND_TRIES` times; one whose store does not answer waits for it
        (:func:`wait_for_store`) and meets the others once it does. A node's first, where it joins a world
        that trains, waits for its warm workers first and polls as a heal does."""
        tried, waiting, handler = 1, None, group.spec.rdzv_handler
        joins = 0 if book.nodes else heal_meeting.joining(handler)  # a running world pauses for this node
        warm.before_joining(joins, heal_round.say)
        while True:
            try:
                with heal_meeting.polling(handler) if joins else contextlib.nullcontext():
                    rendezvous(self, group)
            except DistStoreError as exc:
                if not book.elastic or tried == ROUND_TRIES:
                    raise
                tried += 1
                heal_round.say(
                    "the round formed but its rank assignment "
                    f"timed out ({str(exc).splitlines()[0][:200]}): a member went silent as it formed; "
                    f"meeting the next round without it (try {tried} of {ROUND_TRIES})"
                )
                continue
            except (RendezvousConnectionError, DistNetworkError) as exc:
                waiting = wait_for_store(self, group, exc, waiting)
                continue
            if waiting is not None:
                waiting.answered()
            return

    def wait_for_store(self: Any, group: Any, exc: Exception, waiting: StoreWait | None) -> StoreWait:
        """An elastic agent's rendezvous that failed with its store's error (``exc``: the store's pod lost,
        its replacement not ready): wait until the store answers again and this agent reached it
        (:mod:`.outage`), or raise ``exc`` after :data:`store.WAIT_SECONDS`, or at once for a rigid job
        (whose store died with node 0) or a store of torch's own."""
        found = store.endpoint(os.environ)
        if not book.elastic or found is None:
            raise exc
        waiting = waiting or StoreWait(f"{found[0]}:{found[1]}")
        if not waiting.missed(exc):
            raise exc
        watch = getattr(self, "_ddpjob_silence", None) or RoundWatch(group.spec.rdzv_handler, presence=True)
        while not reach(watch):
            time.sleep(POLL_SECONDS)
            if not waiting.missed(exc):
                raise exc
        waiting.reached()
        return waiting

    def rendezvous_(self: Any, group: Any, healing: bool = False) -> None:
        """torch's rendezvous, met (:func:`meet`) and booked; ``healing`` (:mod:`.heal_round`): the workers
        were not stopped, so their marks stay and no restart was spent."""
        borrowed = book.borrowed
        meet(self, group)
        warm_failure_path()  # once, the built-in trainer's
        if not healing:
            marks.clear()  # the last round's workers ended; this round's start after it
        handler = group.spec.rdzv_handler
        change, refund = book.rendezvoused(int(group.group_world_size), round_of(group), healing=healing)
        self._remaining_restarts += refund
        if change == SAME and borrowed:  # a failure of this gang's own, and no restart was left
            raise RuntimeError("a worker failed and no gang restart in place is left (spec.maxRestarts)")
        if isinstance(handler, DynamicRendezvousHandler):
            if getattr(self, "_ddpjob_silence", None) is None:
                host = os.environ.get(contract.PET_NODE_RANK, "").strip() == "0"
                external = store.endpoint(os.environ) is not None
                self._ddpjob_silence = RoundWatch(handler, not external and not host, presence=external)
            self._ddpjob_silence.begin()
        if notice_at is not None and not healing:  # fresh workers: an earlier world's sever is not theirs
            notice.clear_sever(notice_at)

    if ways is not None:  # a node waits (one joins, or a survivor healed first): heal, not restart
        restart = heal_round.restart_or_heal(SimpleElasticAgent._restart_workers, ways)
        SimpleElasticAgent._restart_workers = restart  # type: ignore[method-assign]
    LocalElasticAgent._monitor_workers = monitor_workers  # type: ignore[method-assign]
    SimpleElasticAgent._rendezvous = rendezvous_  # type: ignore[method-assign]
    waiting = DynamicRendezvousHandler.num_nodes_waiting
    if book.elastic:
        DynamicRendezvousHandler.num_nodes_waiting = patient(waiting)  # type: ignore[method-assign]
    else:
        DynamicRendezvousHandler.num_nodes_waiting = bounded_waiting(waiting)  # type: ignore[method-assign]


def main(argv: Sequence[str]) -> int:
    """Run torchrun with ``argv``; its exit code (a not-retried worker code passes through)."""
    whole_lines(sys.stderr)  # its workers write to the same file
    state = os.environ.get(contract.LAUNCH_STATE_ENV) or f"{tempfile.mkdtemp(prefix='ddp-')}/launch.json"
    os.environ[contract.LAUNCH_STATE_ENV] = state  # the workers inherit it
    # A fresh store for the workers of every round: the shared one keeps the last round's keys, and a
    # restarted gang read its dead peers' addresses from it (gloo: connectFullMesh refused).
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    os.environ.update(rendezvous_host(os.environ))
    if (found := store.endpoint(os.environ)) and not store.wait_for(*found):
        return contract.FAILURE_EXIT_CODE  # a crash: the next attempt gets a new store pod
    book = Book(Path(state), elastic=":" in os.environ.get("PET_NNODES", ""))
    marks = workers.Marks(Path(state).parent)
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousClosedError

    args = torchrun.parse_args(list(argv))  # type: ignore[no-untyped-call]
    builtin = args.training_script_args if runs_builtin(args) else None
    armed = book.heals = heal_round.arm(os.environ, elastic=book.elastic, builtin=builtin)  # and its workers
    _install(book, marks, notice.notice_path(os.environ) if armed else None)
    if builtin is not None:
        torchrun.config_from_args = warm_config_from_args(torchrun.config_from_args)
        marks.builtin = True  # its workers leave marks (SyncHealth)
    if found:  # gathered last, with nothing slow left before torch's rendezvous (a late pod misses none)
        store.announce(*found, str(args.rdzv_id), args.local_addr or socket.getfqdn())  # torch's name for it
        store.gather(*found, nodes=int(os.environ.get(contract.NNODES) or 1))
    try:
        torchrun.run(args)  # type: ignore[no-untyped-call]
    except ChildFailedError as err:
        code = exit_code_of({rank: failure.exitcode for rank, failure in err.failures.items()})
        print(err.format_msg(), file=sys.stderr, flush=True)  # type: ignore[no-untyped-call]
        return code
    except SignalException as err:  # this pod is stopped (the kubelet's SIGTERM); its workers stopped first
        print(f"[launcher] stopped by {err.sigval.name}", file=sys.stderr, flush=True)
        return 128 + int(err.sigval)  # 143 for SIGTERM: the Job's podFailurePolicy reads it as taken away
    except RendezvousClosedError:
        if store.endpoint(os.environ) is None:  # a rigid job's closed rendezvous: a failure as before
            raise
        if book.nodes:  # this node trained: another node's agent gave up and closed the rendezvous
            print(CLOSED_UNDER, file=sys.stderr, flush=True)
            return contract.FAILURE_EXIT_CODE
        print(LATE_JOINER, file=sys.stderr, flush=True)
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
