"""The launcher's bookkeeping of restarts in place, which the workers and the operator read: each failure
its agent sees, then what the next rendezvous made of it (:class:`Book`)."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from ddp_trainer import contract
from ddp_trainer.core.inplace import (
    HISTORY,
    OTHER_NODE,
    RESIZED,
    SAME,
    UNCHANGED,
    Change,
    LaunchState,
    cause,
    world_change,
    write_state,
)

RESTARTED_FROM = {
    contract.RESTART_FROM_OTHERS: (
        "from the others' state where they heal in place, else from the last checkpoint"
    ),
    contract.RESTART_FROM_CHECKPOINT: "from the last checkpoint",
}
"""How a restart's line says where its workers' state comes from."""


class Book:
    """The launcher's side of the bookkeeping: the failure seen, then what the next rendezvous made of it
    (:func:`~ddp_trainer.core.inplace.world_change`): a restart in place (the same number of nodes), or a
    resize of an elastic job (fewer nodes: a peer was lost; more: one joined), which is no restart and spends
    none."""

    def __init__(self, path: Path, elastic: bool = False) -> None:
        self.path, self.elastic = path, elastic
        self.state = LaunchState()
        self.pending: tuple[str, float] | None = None
        self.nodes = 0
        """The nodes of the last rendezvous (0: none yet)."""
        self.borrowed = False
        """An elastic job's failure with no restart left: the agent was lent one, to see at the rendezvous
        whether a peer's loss failed the workers (a shrink, free) or not (then the agent gives up)."""
        self.stopped = False
        """The last stop of this pod's workers was asked by another node (see :meth:`failed`)."""
        self.silent = False
        """The last stop was for a silent peer (or this node was dropped as one)."""
        self.heals = False
        """This launcher heals (``DDPJOB_HEAL=1``): workers it restarts take their state from the others where
        those heal in place, not from the last checkpoint."""
        self.fallen = ""
        """Why this pod's workers' heal in place failed, when the launcher stopped them for it
        (:meth:`fell_back`), until the next rendezvous."""
        write_state(path, self.state)

    def failed(
        self,
        failures: Mapping[int, tuple[int, str]],
        stopped: bool = False,
        why: str = "",
        silent: bool = True,
    ) -> None:
        """This pod's workers ended: they failed, or (``stopped``, an elastic job's) they were stopped for
        another node: at a step boundary because it asked (it leaves, or one joins), or at once because it
        went silent (``why`` says so: :mod:`ddp_trainer.launch.silence`), or, ``silent`` False, because it
        was lost while they started (they waited for its store). After :meth:`fell_back` their exits (the
        launcher's SIGKILL) are booked as the failed heal."""
        if self.fallen and not why:
            why, silent = self.fallen, False
        self.fallen = ""
        self.pending = (why or cause(failures), time.time())
        self.stopped, self.silent = stopped, bool(why) and silent

    def peer_stopped(self, code: int | None) -> bool:
        """An elastic job's workers stopped at a step boundary with the interrupted code (143), this agent not
        signalled (that raises torch's ``SignalException`` first): another node asked. Its pod leaves (the
        kubelet's SIGTERM) or its agent stopped the world for a grow, and the trainer's per-step stop flag
        stopped every rank there, after its checkpoint. The agent meets the others again at the world that
        is left instead of ending its pod (which would close the rendezvous)."""
        return code == contract.INTERRUPTED_EXIT_CODE and self.elastic

    def fell_back(self, why: str) -> None:
        """This pod's workers' heal in place failed (``why``, the cause of the restart in place that follows)
        and the launcher stops them: booked now, whether the agent sees them ended first or restarts them
        for a waiting node; the world change the heal booked is said as restarted (:meth:`heal_refused`)."""
        self.failed({}, why=why, silent=False)
        self.fallen = why
        self.heal_refused()

    def rendezvoused(self, nodes: int, round_number: int = -1, healing: bool = False) -> tuple[str, int]:
        """Records a rendezvous of ``nodes`` nodes (in rendezvous round ``round_number``): the change
        (:func:`world_change`) and how many restarts to give back to the agent (1 when a failure it counted
        turned out to be a resize; none when ``healing``: the workers were not stopped, no restart spent)."""
        change, refund = self._rendezvoused(nodes, round_number, healing)
        return change, 0 if healing else refund

    def _rendezvoused(self, nodes: int, round_number: int, healing: bool) -> tuple[str, int]:
        change, before, failure, borrowed = (
            world_change(self.nodes, nodes),
            self.nodes,
            self.pending,
            self.borrowed,
        )
        own = failure is not None and not self.stopped
        silent = self.silent
        self.nodes, self.borrowed, self.stopped, self.silent, self.fallen = nodes, False, False, False, ""
        if change == SAME and (self.elastic or healing) and not own:
            # An elastic job's world met again at the same size, and no worker of this pod failed: its agent
            # stopped them for a node that waited to join (which then missed this round's 2 s last call
            # and joins at the next: a grow, late), or a node whose rank failed re-joined (that node's agent
            # counts the restart, and the operator reads the highest count any pod says). Not this pod's
            # restart to count; torch's restart it spent, if any, is given back.
            # Healing (a rigid job's too): another node's rank crashed and restarted, its fresh workers join
            # this pod's, which heal in place.
            self.pending = None
            why = (
                "this pod's workers heal in place (another node restarts its failed rank and counts it)"
                if healing
                else "with this node, which was dropped as silent and stopped its stale workers (a resize, "
                "not a restart)"
                if silent
                else "after a stop this pod did not cause (a joining node missed the round and joins at the "
                "next, or another node restarts its failed rank and counts it)"
            )
            print(
                f"{contract.log_stamp(time.time())} [launcher] the world met again at {nodes} node(s) {why}: "
                "not counted here",
                file=sys.stderr,
                flush=True,
            )
            return UNCHANGED, int(failure is not None and not borrowed)
        if change == RESIZED:
            self.pending = None
            at = failure[1] if failure is not None else time.time()
            mode = contract.RESIZE_HEALED if healing else contract.RESIZE_RESTARTED
            self.resized(before, nodes, at, silent, round_number, mode)
            how = "heal in place" if healing else "resume from the last checkpoint"
            print(
                f"{contract.log_stamp(time.time())} [launcher] the world changed from {before} to {nodes} "
                f"node(s) (elastic): no restart spent; this pod's workers {how} (why: {self.state.resize})",
                file=sys.stderr,
                flush=True,
            )
            return change, int(failure is not None and not borrowed)
        if change == SAME:
            self.restarting()
        return change, 0

    def resized(
        self,
        before: int,
        nodes: int,
        at: float,
        silent: bool = False,
        round_number: int = -1,
        mode: str = contract.RESIZE_RESTARTED,
    ) -> None:
        """Records a world change for the workers to report: a larger world is a node that (re)joined; a
        smaller one lost a node that went silent (:mod:`~ddp_trainer.launch.silence` said so) or ended;
        ``mode``: healed in place (the heal under way) or its workers restarted. The operator names a change
        it made by ``spec.nodes`` itself (``contract.RESIZE_SCALED``)."""
        reason = contract.RESIZE_REJOINED
        if nodes < before:
            reason = contract.RESIZE_SILENT if silent else contract.RESIZE_LOST
        self.state = dataclasses.replace(
            self.state,
            resizes=self.state.resizes + 1,
            resize=reason,
            resize_from=before,
            resize_to=nodes,
            resize_at=at,
            history=(*self.state.history, Change(round_number, reason, before, nodes, at, mode))[-HISTORY:],
        )
        write_state(self.path, self.state)

    def heal_refused(self) -> None:
        """The heal of the last world change failed (:mod:`~ddp_trainer.launch.heal_round`): its workers
        restart from the last checkpoint, so the change is said as restarted."""
        if self.state.history and self.state.history[-1].mode == contract.RESIZE_HEALED:
            last = dataclasses.replace(self.state.history[-1], mode=contract.RESIZE_RESTARTED)
            self.state = dataclasses.replace(self.state, history=(*self.state.history[:-1], last))
            write_state(self.path, self.state)

    def restarting(self) -> None:
        why, at = self.pending or (OTHER_NODE, time.time())
        self.pending = None
        source = contract.RESTART_FROM_OTHERS if self.heals else contract.RESTART_FROM_CHECKPOINT
        self.state = dataclasses.replace(
            self.state, restarts=self.state.restarts + 1, cause=why, at=at, restart_from=source
        )
        write_state(self.path, self.state)
        print(
            f"{contract.log_stamp(at)} [launcher] gang restart in place {self.state.restarts}: {why}; "
            f"restarting this pod's workers {RESTARTED_FROM[source]}",
            file=sys.stderr,
            flush=True,
        )
