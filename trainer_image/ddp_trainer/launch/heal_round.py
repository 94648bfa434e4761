"""The launcher's side of a heal without a restart (issue 57, stage 1: a lost peer; the worker's side is
:mod:`ddp_trainer.sync.heal`).

Armed (:func:`armed`) by default for the built-in trainer of an elastic job on gloo, and for any job that
asks for it (``DDPJOB_HEAL=1``: a user's loop through
:class:`~ddp_trainer.sync.healing.HealingSyncHealth`; a rigid job heals a crashed rank only); never under
``DDPJOB_HEAL=0``. Armed, the launcher sets the variable to ``1`` for its workers; otherwise it takes it
away from them, and they heal only under it. When one of this
launcher's workers marks itself heal-wanted (a collective failed with a peer's loss; the worker waits,
bounded), the agent (:func:`heal`):

1. runs the next rendezvous *without stopping its workers* (ddpjob's wrapped ``_rendezvous``, told it
   heals: the workers' marks stay, no restart is counted or given back), so the world is the one torch
   assigns, as a restart's would be;
2. puts its workers' process ids back on the group torch's rendezvous rebuilt (else its monitor finds the
   ids differ from its processes' and says the group's state is unknown);
3. writes the notice of the new world beside the launch state (:mod:`ddp_trainer.core.notice`);
4. waits up to :data:`HEAL_SECONDS` for every local worker's healed mark of that round. A worker that
   ends, a heal-failed mark or the deadline: the workers are stopped (SIGKILL; the restore point is the last
   checkpoint) and the agent takes the path it took before heals (a restart of this pod's workers; the
   other nodes follow through the rendezvous), booked with the heal's failure as its cause
   (:data:`FELL_BACK`: a worker's mark says why, e.g. the healed world's replica check), not the SIGKILL.

torch's agent restarts its workers when a node waits to join while its own look healthy (``_invoke_run``'s
healthy branch): a node that joins (a grow), or, after a loss, another node's agent that healed first and
waits in the rendezvous, maybe before this node's workers failed. Armed, that restart heals instead
(:func:`restart_or_heal`): workers that marked themselves heal-wanted are healed; workers that formed their
group and train are asked to leave it together at the next step boundary (:func:`when_waited`: the ranks
agree on it, no step lost), or, where no step ends in time, to shut their connections down (as for a
silent member, below); workers still forming theirs are given
:data:`GRACE_SECONDS` to mark, then restarted.

Workers that start fresh in a round whose other members heal (the joiner of a grow, a crashed worker's
replacement, the workers a fallback restarted) meet the healers there (:func:`ddp_trainer.sync.join.join`):
their state is copied from a live replica, not read from storage.

A member that goes silent (frozen, cut off: its sockets stay open, so no collective fails by itself) is
healed too (:func:`when_silent`): once the round's keep-alive watch judges it silent, the launcher asks its
workers to shut their connections down (:class:`~ddp_trainer.core.notice.SeverWatch`: their blocked
collective then fails within milliseconds, measured on gloo, where ``abort()`` does not end it) and heals
them. A store's host gone is not healed (the workers wait for a store no one serves).

Not here yet (the design's later stages): the fallback told to the other nodes through the store.

The round a heal meets, and torch's rendezvous closing it once its nodes joined:
:mod:`ddp_trainer.launch.heal_meeting`.

Long because the heal's ways in (a worker's mark, a silent member, a node waiting to join) share the one
decision of when the launcher heals and the one booking of what it did: split, they would drift.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from ddp_trainer import contract
from ddp_trainer.core import notice
from ddp_trainer.core.config import TrainerConfig, build_parser
from ddp_trainer.core.notice import Note, Notice
from ddp_trainer.launch import silence
from ddp_trainer.launch.book import Book
from ddp_trainer.launch.heal_meeting import closing_at, members_alive, polling, say_healing
from ddp_trainer.launch.rounds import stop_now
from ddp_trainer.launch.workers import Marks, pids
from ddp_trainer.sync import heal as sync_heal

HEAL_ENV = sync_heal.HEAL_ENV
"""``1``: this pod's launcher heals (where it can: :func:`armed`), and so do its workers."""
HEAL_SECONDS = 90.0
"""How long the agent waits for its workers' healed marks after it wrote the notice: their new group's
connect (the worker's timeout, 60 s) and more."""
POLL_SECONDS = 0.1
GRACE_SECONDS = 3.0
"""How long torch's restart for a waiting node waits, when armed, for a worker's heal-wanted mark: a worker
that lost a peer leaves its group at once, so the others fail within a second (measured for the design)."""
GROW_BOUNDARY_SECONDS = 10.0
"""How long a grow waits for the workers to leave their group at a step boundary before it asks them to
shut their connections down (their step in flight is then dropped, as after a loss)."""
LOST_PEER = "a worker lost a peer (its collective failed): healed in place"
"""The cause the launcher books for a heal's world change."""
FELL_BACK = "the heal in place failed"
"""The cause the launcher books for the restart in place after a failed heal, before the worker's why."""


def armed(env: Mapping[str, str], *, elastic: bool = False, builtin: Sequence[str] | None = None) -> bool:
    """Whether this launcher heals. ``DDPJOB_HEAL=1``: asked to; ``0``: not. Unset: the built-in trainer
    (``builtin``: its flags) of an elastic job heals where its group is gloo's (:func:`on_gloo`; an NCCL
    group's heal is a later stage), the design's default; anything else restarts, as before heals. A user's
    script heals when asked, and when it runs its steps through
    :class:`ddp_trainer.sync.healing.HealingSyncHealth` (one that does not is restarted, as before: its
    worker ends with the error, or, for a grow, once it has not left its group in time). An elastic job
    heals a lost peer, a silent one and a node that joins; a rigid one, asked (no smaller world to heal
    into), a rank that crashed, whose fresh workers join the others' heal."""
    asked = env.get(HEAL_ENV, "").strip()
    if asked:
        return asked == "1"
    return elastic and builtin is not None and on_gloo(builtin)


def arm(env: MutableMapping[str, str], *, elastic: bool, builtin: Sequence[str] | None) -> bool:
    """:func:`armed`, told to the workers, which inherit ``env``: ``DDPJOB_HEAL=1`` where this launcher
    heals, unset where it does not (they heal only under it)."""
    on = armed(env, elastic=elastic, builtin=builtin)
    if on:
        env[HEAL_ENV] = "1"
    else:
        env.pop(HEAL_ENV, None)
    return on


def on_gloo(argv: Sequence[str], cuda: Callable[[], bool] | None = None) -> bool:
    """Whether the built-in trainer's flags ``argv`` give it gloo's group, read by the trainer's own parser
    (``build_parser``) and rule (:meth:`ddp_trainer.core.config.TrainerConfig.resolved_backend`): the host
    is asked (``cuda``: torch's ``cuda.is_available``) only where both flags say ``auto``. Flags the trainer
    refuses: not gloo (its worker says why and exits 2)."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # the worker prints the usage error, once
            known, _ = build_parser().parse_known_args(list(argv))
    except SystemExit:
        return False
    config = TrainerConfig(device=known.device, backend=known.backend)
    host_decides = config.device == "auto" and config.backend == "auto"
    if host_decides and cuda is None:
        import torch

        cuda = torch.cuda.is_available
    has_cuda = host_decides and cuda is not None and cuda()
    return config.resolved_backend(config.resolved_device(has_cuda)) == "gloo"


def wanting(notes: Sequence[Note | None]) -> bool:
    """Whether a worker's mark asks for a heal."""
    return any(note is not None and note.kind == notice.HEAL_WANTED for note in notes)


def outcome(notes: Sequence[Note | None], round_: int) -> str | None:
    """``"healed"`` when every worker healed into round ``round_``, why the heal failed when one says it
    did, None while they heal."""
    for note in notes:
        if note is not None and note.kind == notice.HEAL_FAILED and note.round == round_:
            return note.why or "a worker's heal failed"
    if notes and all(n is not None and n.kind == notice.HEALED and n.round == round_ for n in notes):
        return notice.HEALED
    return None


def notice_of(group: Any, round_: int, trigger: str, at: float) -> Notice:
    """The notice of the world torch's rendezvous just assigned ``group``'s workers."""
    return Notice(
        round=round_,
        ranks={int(w.local_rank): int(w.global_rank) for w in group.workers},
        world_size=int(group.workers[0].world_size),
        group_rank=int(group.group_rank),
        group_world_size=int(group.group_world_size),
        master_addr=str(group.master_addr),
        master_port=int(group.master_port),
        trigger=trigger,
        at=at,
    )


@dataclasses.dataclass(frozen=True)
class Healing:
    """What every way into a heal needs of its launcher: its look at the workers (``monitor``: torch's
    ``_monitor_workers``, ddpjob's wrapper), their marks, its book, the notice's ``path`` and the round
    torch's rendezvous gave the group (``round_of``)."""

    monitor: Callable[[Any, Any], Any]
    marks: Marks
    book: Book
    path: Path
    round_of: Callable[[Any], int]


def say(line: str) -> None:
    print(f"{contract.log_stamp(time.time())} [launcher] {line}", file=sys.stderr, flush=True)


def heal(
    agent: Any,
    group: Any,
    ways: Healing,
    trigger: str,
    seconds: float = HEAL_SECONDS,
    sever_after: float | None = None,
) -> Any:
    """Heal ``group``'s workers in place (the module's docstring); the agent's view of them after: healthy
    when they healed, else what :func:`stop_now` left (failed), for the caller's path before heals, its
    cause booked (:meth:`Book.fell_back`). ``sever_after``: the workers were asked to leave at a step
    boundary (a grow); none left within that many seconds (a step that does not end), they are asked to
    shut their connections down."""
    from torch.distributed.elastic.agent.server.api import WorkerState

    monitor, marks, path = ways.monitor, ways.marks, ways.path
    before = ways.round_of(group)

    started = time.time()
    ids = {int(w.local_rank): w.id for w in group.workers}
    handler = getattr(getattr(group, "spec", None), "rdzv_handler", None)
    watch = getattr(agent, "_ddpjob_silence", None)
    say_healing(watch, before)
    meeting = members_alive(watch, before)
    alive = (
        f" of {meeting.nodes} node(s) alive{', a node joining' if meeting.joining else ''}" if meeting else ""
    )
    say(f"{trigger}: healing this pod's workers in place (no restart): meeting the next round{alive}")
    last_call = 2 * watch.watch.bound + silence.MARGIN_SECONDS if watch is not None else None
    with closing_at(handler, meeting, last_call), polling(handler):
        agent._rendezvous(group, healing=True)
    for worker in group.workers:
        worker.id = ids[int(worker.local_rank)]
    round_ = ways.round_of(group)
    notice.write_notice(path, notice_of(group, round_, trigger, started))
    deadline = time.monotonic() + seconds
    while True:
        result = monitor(agent, group)
        ended = result.state != WorkerState.HEALTHY
        running = [int(w.id) for w in group.workers]
        notes = [notice.read_note(marks.read(pid) or "") for pid in running]
        done = outcome(notes, round_)
        if sever_after is not None and time.time() - started > sever_after and not any(notes):
            sever_after = None  # once
            waited = time.time() - started
            say(f"no worker left its group at a step boundary in {waited:.0f} s: asking them to sever")
            notice.request_sever(path, before)
        if done == notice.HEALED and not ended:
            ranks = sorted(int(w.global_rank) for w in group.workers)
            say(
                f"healed in place into round {round_} (world size {group.workers[0].world_size}, ranks "
                f"{ranks} here) in {time.time() - started:.1f} s"
            )
            group.state = WorkerState.HEALTHY
            return result
        if done is None and not ended and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
            continue
        why = f"no healed mark within {seconds:.0f} s"
        if done not in (None, notice.HEALED):  # a worker's mark says why (it may have ended since)
            why = str(done)
        elif ended:
            why = f"a worker ended while healing into round {round_}"
        say(f"the heal into round {round_} failed ({why}): its workers restart from the last checkpoint")
        ways.book.fell_back(f"{FELL_BACK}: {why}")
        return result if ended else stop_now(agent, group, monitor)


def wants(group: Any, ways: Healing) -> bool:
    """Whether one of ``group``'s workers marked itself heal-wanted."""
    return wanting([notice.read_note(ways.marks.read(pid) or "") for pid in pids(group)])


def when_wanted(agent: Any, group: Any, result: Any, ways: Healing) -> Any:
    """The agent's look at healthy workers (``result``), healed first when one of them marked itself
    heal-wanted (:func:`heal`, booked as a lost peer's world change); else ``result``."""
    if not wants(group, ways):
        return result
    ways.book.failed({}, stopped=True, why=LOST_PEER, silent=False)
    return heal(agent, group, ways, "a worker of this pod lost a peer")


def when_silent(agent: Any, group: Any, result: Any, verdict: silence.Verdict, ways: Healing | None) -> Any:
    """A member of the round went silent (``verdict``: frozen, powered off, cut off; its sockets stay open, so
    ``group``'s workers, healthy in ``result`` and past forming their group, wait in a collective with it
    that cannot end): they are asked to shut their connections down (:func:`notice.request_sever`; each
    fails its collective as after a peer's loss) and healed (:func:`heal`), booked as the silent member's
    world change; the agent's view of them after. Where the heal falls back, its workers are stopped and the
    restart's cause booked (:meth:`Book.fell_back`), as before heals. None where this launcher does not heal
    (``ways`` None), the verdict is another (this node dropped, a member lost) or the workers have not
    formed their group yet: the caller stops them, as before heals."""
    from torch.distributed.elastic.agent.server.api import WorkerState

    healthy = result.state == WorkerState.HEALTHY
    if ways is None or not ways.book.elastic or verdict.kind != silence.SILENT or not healthy:
        return None  # a rigid job's silent member: its gang restarts, as before heals (no world without it)
    if ways.marks.starting(pids(group)):
        return None
    notice.request_sever(ways.path, ways.round_of(group))
    cause = verdict.cause()
    ways.book.failed({}, stopped=True, why=cause, silent=True)
    return heal(agent, group, ways, f"{cause}; this pod's workers shut their connections down")


def when_waited(agent: Any, group: Any, ways: Healing) -> Any:
    """A node waits in the rendezvous (one joins; or, after a loss, a survivor that healed first) while
    ``group``'s workers, healthy, train in a world they formed: they are asked to leave their group
    together at the next step boundary (:func:`notice.request_grow`; the ranks agree on it, so no step is
    lost; where none left within :data:`GROW_BOUNDARY_SECONDS`, to shut their connections down) and healed
    into the next round, where a joiner takes its state from one of them (:func:`ddp_trainer.sync.join`);
    the agent's view of them after. None while they still form their group (they cannot heal yet)."""
    if ways.marks.starting(pids(group)):
        return None
    notice.request_grow(ways.path, ways.round_of(group))
    trigger = "a node waits to join the world; this pod's workers leave their group at the next step boundary"
    return heal(agent, group, ways, trigger, sever_after=GROW_BOUNDARY_SECONDS)


def restart_or_heal(restart: Callable[[Any, Any], Any], ways: Healing) -> Callable[[Any, Any], Any]:
    """torch's ``_restart_workers``, which heals instead where the workers looked healthy (a node waits to
    join): those that marked themselves heal-wanted (:func:`when_wanted`), or that formed their group
    (:func:`when_waited`), or that form it and mark within :data:`GRACE_SECONDS`; and leaves them be when
    they end meanwhile (workers that finished are not started again for the joiner). A heal that fell back
    restarts them."""
    from torch.distributed.elastic.agent.server.api import WorkerState

    def restart_workers(agent: Any, group: Any) -> Any:
        if group.state == WorkerState.HEALTHY:
            deadline = time.monotonic() + GRACE_SECONDS
            while time.monotonic() < deadline:
                result = ways.monitor(agent, group)
                if result.state != WorkerState.HEALTHY:  # they ended meanwhile (done, or failed): the agent's
                    return None  # next look acts on it (its exit barrier, or its restart, counted), not this
                if wants(group, ways):
                    healed = when_wanted(agent, group, result, ways)
                elif not ways.marks.starting(pids(group)):
                    healed = when_waited(agent, group, ways)
                else:
                    time.sleep(POLL_SECONDS)
                    continue
                if healed.state == WorkerState.HEALTHY:  # healed; else stopped, for the restart
                    return None
                break
        return restart(agent, group)

    return restart_workers
