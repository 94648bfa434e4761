"""A replica's own lease on its peering record, beside Kopf's peering (:mod:`ddp_operator.runtime.peering`).

:class:`Keeper` renews the record every :data:`RENEW_SECONDS` from a thread of its own, fences the replica
when it could not renew for most of the lifetime, and tells, before each reconcile, whether a replica of
higher priority is alive (:meth:`Keeper.may_act`). docs/operator.md, "Renewed every 2 s, and fenced before
it expires", says why Kopf's own keep-alive was not enough.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from kubernetes.client.exceptions import ApiException

from ddp_operator.runtime.peering import GROUP, NAME, VERSION, _api, _places, live_priorities

log = logging.getLogger("ddpjob.operator")

RENEW_SECONDS = 2.0
"""How often :class:`Keeper` renews this replica's record (client-go's leader election retries every 2 s)."""
FENCE_MARGIN_SECONDS = 4.0
"""A replica that could not renew its record for ``lifetime`` less this long stops acting: its last writes
are done before a standby may see the record expire and act."""
UNFENCE_RENEWALS = 3
"""Renewals in a row a fenced replica makes before it acts again: a standby that took over meanwhile has
seen the record come back (Kopf's peering pauses it) by then."""


def pointer(identity: str) -> str:
    """The JSON pointer of ``identity``'s record in a peering object (``/`` and ``~`` escaped, RFC 6901)."""
    return "/status/" + identity.replace("~", "~0").replace("/", "~1")


def renewal(identity: str, priority: int, at: dt.datetime) -> list[dict[str, Any]]:
    """A JSON patch that sets the record's ``lastseen`` to ``at`` only while the record is this replica's
    (same priority): one Kopf removed at shutdown, or a peer cleaned away as dead, is not put back."""
    where = pointer(identity)
    return [
        {"op": "test", "path": f"{where}/priority", "value": priority},
        {"op": "replace", "path": f"{where}/lastseen", "value": at.isoformat()},
    ]


def remembered(before: dict[str, Any], now_read: dict[str, Any], at: dt.datetime) -> dict[str, Any]:
    """The records just read, and those read before that are gone from the object but not expired at ``at``:
    Kopf removes a record it judged dead (its autoclean), and a replica whose watch lagged judged a live
    leader dead (measured: a standby's record removed 5 s after its last renewal, with 12 s to live). A
    record is only ever replaced by a later ``lastseen``."""
    out = {key: record for key, record in before.items() if live_priorities({key: record}, "", at)}
    for key, record in now_read.items():
        if not isinstance(record, dict):
            continue
        known = out.get(key)
        if known is None or str(record.get("lastseen", "")) >= str(known.get("lastseen", "")):
            out[key] = record
    return out


class Keeper:
    """Renews this replica's peering record every ``every`` seconds in a daemon thread; ``fenced`` is set
    while the last renewal is more than ``lifetime - FENCE_MARGIN_SECONDS`` old (the operator then makes no
    write: ``handlers.reconcile``) and cleared after :data:`UNFENCE_RENEWALS` renewals in a row."""

    def __init__(
        self,
        namespaces: Sequence[str],
        identity: str,
        priority: int,
        lifetime: int,
        every: float = RENEW_SECONDS,
    ) -> None:
        self.namespaces, self.identity, self.priority = list(namespaces), identity, priority
        self.every, self.fence_after = every, max(2 * every, lifetime - FENCE_MARGIN_SECONDS)
        self.fenced, self.stopping = threading.Event(), threading.Event()
        self.records: dict[str, Any] = {}
        """Every replica's record, as the last renewal's answers held them."""
        self._outranked_by: tuple[int, ...] = ()
        self.renewed = time.monotonic()
        self.renewals = self.fenced_at = 0
        self._thread: threading.Thread | None = None
        self._api: Any = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ddpjob-peering-keeper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def renew(self) -> None:
        """One renewal of the record in every peering object; raises what the API server answered."""
        api = self._api = self._api or _api()  # one client: its connection is kept between renewals
        patch = renewal(self.identity, self.priority, dt.datetime.now(dt.UTC))
        records: dict[str, Any] = {}
        for namespace in _places(self.namespaces):
            if namespace is None:
                body = api.patch_cluster_custom_object(
                    GROUP, VERSION, "clusterkopfpeerings", NAME, patch, **REQUEST
                )
            else:
                body = api.patch_namespaced_custom_object(
                    GROUP, VERSION, namespace, "kopfpeerings", NAME, patch, **REQUEST
                )
            for who, record in ((body or {}).get("status") or {}).items():
                records[f"{namespace}/{who}"] = record  # a replica's records in each namespace
        self.records = remembered(self.records, records, dt.datetime.now(dt.UTC))

    def outranked(self, now: dt.datetime) -> tuple[int, ...]:
        """The priorities above this replica's whose records, as last read, are still alive at ``now``
        (their expiry computed at ``now``: a lost replica's record stops counting the moment it expires)."""
        mine = {key for key in self.records if key.endswith(f"/{self.identity}")}
        alive = live_priorities({k: v for k, v in self.records.items() if k not in mine}, "", now)
        return tuple(sorted(p for p in alive if p > self.priority))

    def may_act(self) -> bool:
        """Not fenced, and no live replica of higher priority in the last reading; says each change once.
        The fence is checked here too, not only by the renewing thread: a replica that wakes from a stall
        has reconciles ready to write before that thread has run again."""
        self.check(time.monotonic())
        above = () if self.fenced.is_set() else self.outranked(dt.datetime.now(dt.UTC))
        if above != self._outranked_by:
            self._outranked_by = above
            if above:
                log.warning(
                    "a replica of higher priority (%s) is alive in the peering object: this one (%d) makes "
                    "no writes while it is (Kopf's own pause should have stopped its handlers already)",
                    ", ".join(map(str, above)),
                    self.priority,
                )
        return not self.fenced.is_set() and not above

    def check(self, now: float) -> None:
        """Fence or unfence by how old the last renewal is at ``now`` (``time.monotonic()``)."""
        late = now - self.renewed
        if late > self.fence_after and not self.fenced.is_set():
            self.fenced.set()
            self.fenced_at = self.renewals
            log.warning(
                "could not renew this replica's peering record for %.0f s (its lifetime less %.0f s): making "
                "no writes until it is renewed, so that a standby that takes over never acts beside it",
                late,
                FENCE_MARGIN_SECONDS,
            )
        elif self.fenced.is_set() and self.renewals - self.fenced_at >= UNFENCE_RENEWALS:
            self.fenced.clear()
            log.warning("this replica's peering record is renewed again: acting as before")

    def _run(self) -> None:
        said = ""
        while not self.stopping.wait(self.every):
            try:
                self.renew()
                self.renewed, self.renewals, said = time.monotonic(), self.renewals + 1, ""
            except Exception as exc:  # an answer, a refused or timed-out connection (urllib3's own errors)
                self.fenced_at = self.renewals  # renewals in a row, for UNFENCE_RENEWALS
                why = f"{exc.status} {exc.reason}" if isinstance(exc, ApiException) else type(exc).__name__
                if why != said:  # each new answer once, not every 2 s
                    log.info(
                        "could not renew the peering record of %s (%s); Kopf's keep-alive goes on",
                        self.identity,
                        why,
                    )
                    said = why
            self.check(time.monotonic())


JSON_PATCH = "application/json-patch+json"
REQUEST: dict[str, Any] = {"_content_type": JSON_PATCH, "_request_timeout": (3, 5)}
"""Each renewal gives up after 3 s to connect and 5 s to answer: without a timeout, a connection to an API
server that restarted hung the renewing thread for a minute (measured), and the fence then stopped a
healthy operator."""
