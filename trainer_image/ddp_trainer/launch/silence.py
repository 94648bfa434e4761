"""A peer that goes silent: what an elastic job's agent makes of the rendezvous' keep-alives while its
workers train (pure; :mod:`ddp_trainer.launch.agent` feeds it torch's rendezvous state).

A node whose processes die closes its sockets, and the survivors' collectives fail at once. A node that
loses its power, its kernel or its network closes nothing: its processes are frozen or cut off, and every
survivor waits in a collective with it until the collective's timeout (``spec.nccl.timeoutSeconds``, 30
minutes by default). Its agent stops renewing its rendezvous keep-alive too, and that is what this module
watches: each survivor's agent reads the rendezvous state (every :data:`POLL_SECONDS`) and notes, on its own
clock, when each member of its round last renewed. A member that has not renewed for the keep-alive bound
(``keep_alive_interval × keep_alive_max_attempt``: 5 s for an elastic DDPJob) is silent: the agent stops its
own workers (they wait in a collective that cannot end) and meets the others at the next round, without it.
The first agent to judge leaves a mark in the store (:func:`mark_key`) so that the others follow at their
next poll, whatever they saw themselves.

Only the agent's keep-alive counts, never the workers' progress: a rank ten times slower than the others, or
rank 0 writing a checkpoint for a minute, is not silent, because its agent renews as usual.

A member that left the state with a fresh keep-alive left on purpose (its agent stops its workers for a grow
or a leave, and then meets the next round): not silent, and its stop reaches this node's workers through the
job's own step-boundary agreement. One whose keep-alive had stopped before it left was removed by another
agent's reading of the state (torch's sanitizer drops a node past the bound): silent.

A member whose process ended (killed, its node lost) also leaves with a fresh keep-alive: the store's
process watch drops it at once. While the workers train, its end fails their collective at once. But while
they start, none of theirs fails: the round's rank-0 member (:attr:`Watch.host`) hosts the workers' store
(torch's ``MASTER_ADDR``/``MASTER_PORT``, its rank 0 worker's), and a worker that had not connected to it yet
retries its connection until the group's timeout (30 minutes by default). So the host gone, this agent's
workers still running :data:`LOST_AFTER_SECONDS` later wait for it: it was lost (:data:`LOST`), and the
agent stops them. Its workers stopped at a step boundary end long before that, for they have no checkpoint
to write: the host's rank 0 writes it, before its agent leaves.

Any other member lost while the workers start leaves them waiting too: rank 0's worker waits in its store for
the lost rank's, and the others for rank 0's group. So an agent whose workers have not yet said that their
group formed (``starting``: each worker leaves a mark once every rank took part in a collective with it,
:func:`ddp_trainer.core.inplace.mark_worker`, read by :mod:`ddp_trainer.launch.workers`) and still run
:data:`LOST_AFTER_SECONDS` after any member left the round takes that member as lost too. Once the group
formed, a member's loss fails a collective at once, and a member that leaves on purpose does so at a step
boundary the whole world agreed on: nothing is judged then, so rank 0 writing the checkpoint of that step is
never stopped.

A node that was dropped and wakes (its network restored, its processes resumed) finds itself no longer a
member of its round: its workers are stale, the world went on without them, so its agent stops them at once
(no checkpoint of theirs is written after that) and joins the next round like any new node.

An agent that itself could not run for a while (a stall of its own) judges nobody from that gap: it cannot
tell whether the others were silent or it was.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field

POLL_SECONDS = 0.5
"""How often an agent whose workers are healthy reads the rendezvous state (one store read)."""
STALLED_AFTER = 4 * POLL_SECONDS
"""A gap between two of this agent's own polls longer than this is a stall of its own: it judges nobody
from it."""
LEFT_FRESH_SECONDS = 3.0
"""A member that vanished from the state having renewed within this is taken to have left on purpose, where
the keep-alive interval is an elastic job's 1 s (renewals come every 1-2 s; the bound is 5 s). A longer
interval stretches it: :attr:`Watch.left_fresh`."""
MARGIN_SECONDS = 1.0
"""Added to the keep-alive bound before a member still in the state is judged: torch's own sanitizer drops a
member at the bound, but only at a rendezvous; here a judgement stops the workers of a world that trains, so
an agent of the round whose keep-alive thread ran a second late on a loaded machine is given that second."""
LOST_AFTER_SECONDS = 6.0
"""How long this agent's workers may run on after the round's host (its rank-0 member), or any member while
they start, left it before they are taken to wait for it (the bound and the margin: its workers stopped at a
step boundary end within a second or two)."""
MARK_PREFIX = "ddpjob/silent"

SILENT, DROPPED, LOST = "silent", "dropped", "lost"


def mark_key(run_id: str, round_number: int) -> str:
    """The store key an agent sets when it judged a member of round ``round_number`` silent."""
    return f"{MARK_PREFIX}/{run_id}/{round_number}"


@dataclass(frozen=True)
class Verdict:
    """``silent``: members of this agent's round stopped answering (``nodes``, their names); ``dropped``:
    this agent itself was dropped from its round (it was silent, and woke); ``lost``: the round's host left
    it while this agent's workers still ran (they wait for its store), or another member left it before
    they formed their group (they wait for its rank)."""

    kind: str
    nodes: tuple[str, ...]
    seconds: float
    """How long the silent member had not renewed (by this agent's clock; 0 when another agent judged), or
    since the lost member left."""
    judged_here: bool = True
    host: bool = True
    """``lost``: the member lost is the round's host (else another member, lost while the workers start)."""

    def names(self) -> str:
        return ", ".join(self.nodes)

    def cause(self) -> str:
        """One sentence for the launcher's log and its book."""
        names = self.names()
        if self.kind == DROPPED:
            return (
                "this node was dropped from its round as silent (it stopped renewing its keep-alive: "
                "frozen or cut off); its workers are stale and stop now, and the node joins the next round"
            )
        if self.kind == LOST and not self.host:
            return (
                f"node(s) {names} left the round {self.seconds:.1f} s ago, before this node's workers formed "
                "their group, and they still run: they wait for its rank, which will not come (its process "
                "ended as they started)"
            )
        if self.kind == LOST:
            return (
                f"node {names}, rank 0's (it hosts the workers' store), left the round {self.seconds:.1f} s "
                "ago and this node's workers still run: they wait for it (its process ended as they started)"
            )
        if not self.judged_here:
            return f"node(s) {names} went silent (another node's agent saw it first)"
        return (
            f"node(s) {names} went silent: no keep-alive for {self.seconds:.1f} s "
            "(frozen, powered off or cut off)"
        )


@dataclass
class Watch:
    """One agent's view of its round's members (``name(node)`` names a member for people)."""

    bound: float
    """The keep-alive bound, in seconds."""
    interval: float = 1.0
    """torch's keep-alive interval, in seconds (an elastic DDPJob's 1 s; a rigid one's is torch's 5 s)."""
    round_number: int = -1
    me: Hashable | None = None
    members: frozenset[Hashable] = frozenset()
    seen: dict[Hashable, tuple[object, float]] = field(default_factory=dict)
    """Each member's last keep-alive value, and when (this agent's monotonic clock) it last changed."""
    last_poll: float = 0.0
    host: Hashable | None = None
    """The round's rank-0 member, which hosts its workers' store (known when ``members`` maps each to its
    rank, as torch's ``participants`` do)."""
    host_left: float | None = None
    """When the host was seen gone from the state with a fresh keep-alive (this agent's clock)."""
    left: dict[Hashable, float] = field(default_factory=dict)
    """When each member was seen gone from the state with a fresh keep-alive (this agent's clock)."""

    def begin(
        self,
        round_number: int,
        me: Hashable,
        members: Iterable[Hashable],
        beats: Mapping[Hashable, object],
        now: float,
    ) -> None:
        """A round began with ``members`` (this agent's rendezvous returned; a mapping: each one's rank)."""
        self.round_number, self.me, self.members = round_number, me, frozenset(members)
        ranks = members if isinstance(members, Mapping) else {}
        self.host = next((node for node, rank in ranks.items() if rank == 0), None)
        self.host_left, self.left = None, {}
        self.seen = {node: (beats.get(node), now) for node in self.members}
        self.last_poll = now

    @property
    def left_fresh(self) -> float:
        """How recently a member that vanished from the state must have renewed to have left on purpose:
        an agent renews only once its last keep-alive is a full interval old, so two renewals may be two
        intervals apart (:data:`LEFT_FRESH_SECONDS` for an elastic job's 1 s; 11 s for a rigid job's 5 s,
        whose member leaves the round at once when its own rank fails, and was taken for silent when its
        last renewal was more than 3 s old: the gang then failed instead of restarting in place)."""
        return max(LEFT_FRESH_SECONDS, 2 * self.interval + MARGIN_SECONDS)

    def due(self, now: float) -> bool:
        return self.me is not None and now - self.last_poll >= POLL_SECONDS

    def excuse(self, nodes: Iterable[Hashable], now: float) -> None:
        """``nodes`` count as renewed at ``now``: their keep-alives in the state are ahead of the clock, held
        there when a store that came back empty was given the round back
        (:func:`ddp_trainer.launch.rounds.refreshed`), so that the nodes still reaching the new store are
        not judged silent meanwhile."""
        for node in nodes:
            if node in self.seen:
                self.seen[node] = (self.seen[node][0], now)

    def observe(
        self,
        round_number: int,
        participants: Iterable[Hashable],
        beats: Mapping[Hashable, object],
        mark: str | None,
        now: float,
        name: object = str,
        starting: bool = False,
    ) -> Verdict | None:
        """What the state read at ``now`` says: nothing, a silent member, a lost one, or this agent dropped.
        ``mark``: what another agent's mark for this round says (the silent nodes' names), if it left one;
        ``starting``: this agent's workers have not said yet that their group formed."""
        if self.me is None:
            return None
        stalled, self.last_poll = now - self.last_poll > STALLED_AFTER, now
        present = set(participants)
        if round_number != self.round_number or self.me not in present:
            # The round moved on, or this node is no member of it, while its workers still ran: another agent
            # removed it (its own leave would have stopped its workers first).
            return Verdict(DROPPED, (_name(name, self.me),), 0.0)
        silent: list[tuple[Hashable, float]] = []
        for node in sorted(self.members - {self.me}, key=repr):
            value, since = self.seen.get(node, (None, now))
            if node in beats and beats[node] != value:
                self.seen[node] = (beats[node], now)
                continue
            if stalled:  # this agent could not look: the gap is its own, not the member's
                self.seen[node] = (value, now)
                continue
            quiet = now - since
            if node in present and node in beats:
                if quiet >= self.bound + MARGIN_SECONDS:
                    silent.append((node, quiet))
            elif quiet >= self.left_fresh:  # gone from the state, and silent before it went
                silent.append((node, quiet))
            else:  # gone with a fresh keep-alive: it left on purpose, and its stop reaches the workers
                self.members -= {node}  # (or its process ended: see host_left and left)
                self.left[node] = now
                if node == self.host:
                    self.host_left = now
        if silent:
            return Verdict(SILENT, tuple(_name(name, node) for node, _ in silent), max(q for _, q in silent))
        if self.host_left is not None and not stalled and now - self.host_left >= LOST_AFTER_SECONDS:
            return Verdict(LOST, (_name(name, self.host),), now - self.host_left)
        lost = [(node, now - at) for node, at in self.left.items() if now - at >= LOST_AFTER_SECONDS]
        if starting and lost and not stalled:
            names = tuple(_name(name, node) for node, _ in sorted(lost, key=lambda gone: repr(gone[0])))
            return Verdict(LOST, names, max(seconds for _, seconds in lost), host=False)
        if mark is not None:
            return Verdict(SILENT, (mark,), 0.0, judged_here=False)
        return None


def _name(name: object, node: Hashable) -> str:
    return str(name(node)) if callable(name) else str(node)
