"""The launcher's bookkeeping of restarts in place, which the workers and the operator read: each failure
its agent sees, then what the next rendezvous made of it (:class:`Book`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path

from ddp_trainer import contract
from ddp_trainer.core.inplace import OTHER_NODE, RESIZED, SAME, LaunchState, cause, world_change, write_state


class Book:
    """The launcher's side of the bookkeeping: the failure seen, then what the next rendezvous made of it:
    a restart in place (the same number of nodes), or a resize of an elastic job (fewer nodes: a peer was
    lost; more: one joined), which is no restart and spends none
    (:func:`~ddp_trainer.core.inplace.world_change`)."""

    def __init__(self, path: Path, elastic: bool = False) -> None:
        self.path, self.elastic = path, elastic
        self.state = LaunchState()
        self.pending: tuple[str, float] | None = None
        self.nodes = 0
        """The nodes of the last rendezvous (0: none yet)."""
        self.borrowed = False
        """An elastic job's failure with no restart left: the agent was lent one, to see at the rendezvous
        whether a peer's loss failed the workers (a shrink, free) or not (then the agent gives up)."""
        write_state(path, self.state)

    def failed(self, failures: Mapping[int, tuple[int, str]]) -> None:
        self.pending = (cause(failures), time.time())

    def rendezvoused(self, nodes: int) -> tuple[str, int]:
        """Records a rendezvous of ``nodes`` nodes: the change (:func:`world_change`) and how many restarts
        to give back to the agent (1 when a failure it counted turned out to be a resize)."""
        change, before, failure, borrowed = (
            world_change(self.nodes, nodes),
            self.nodes,
            self.pending,
            self.borrowed,
        )
        self.nodes, self.borrowed = nodes, False
        if change == RESIZED:
            self.pending = None
            print(
                f"{contract.log_stamp(time.time())} [launcher] the world changed from {before} to {nodes} "
                "node(s) (elastic): no restart spent; this pod's workers resume from the last checkpoint",
                file=sys.stderr,
                flush=True,
            )
            return change, int(failure is not None and not borrowed)
        if change == SAME:
            self.restarting()
        return change, 0

    def restarting(self) -> None:
        why, at = self.pending or (OTHER_NODE, time.time())
        self.pending = None
        self.state = LaunchState(self.state.restarts + 1, why, at)
        write_state(self.path, self.state)
        print(
            f"{contract.log_stamp(at)} [launcher] gang restart in place {self.state.restarts}: {why}; "
            "restarting this pod's workers from the last checkpoint",
            file=sys.stderr,
            flush=True,
        )
