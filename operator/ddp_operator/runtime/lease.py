"""One acting replica: a ``coordination.k8s.io`` Lease, with client-go's rules (docs/operator.md, "A
standby operator").

- Expiry is judged on the reader's own clock: a replica that reads the Lease notes (``time.monotonic()``)
  when its record last changed, and takes it over only once it has seen no change for the record's
  ``leaseDurationSeconds``. No writer's wall clock is compared with a reader's.
- The renew deadline is shorter than the lease: the holder renews every ``retry`` seconds, and a holder
  that has not renewed for ``deadline`` seconds (counted from when it sent its last renewal that succeeded)
  ends its process (:data:`LOST_EXIT`), so its writes are done before any standby can see the lease
  expire, ``duration - deadline`` seconds later at the earliest.
- The process acquires the Lease before Kopf starts and releases it after Kopf stopped (a clean shutdown:
  the holder cleared, so a standby takes over at its next read).

The decisions are pure functions (:func:`observe`, :func:`expired`, :func:`lost`, :func:`check_timing`);
:class:`Elector` reads and writes the Lease (the official client's ``kubernetes.leaderelection`` judges
expiry on the wall clock and neither releases the lease nor lets its holder stop in time). Long because
the whole election is here, its rules and its few requests, to be read in one place.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes.client.exceptions import ApiException

log = logging.getLogger("ddpjob.operator")

LEASE_DURATION_SECONDS = 10
"""How long a standby waits, on its own clock, after it last saw the Lease change before it takes over."""
RENEW_DEADLINE_SECONDS = 7.0
"""How long the holder goes on without a renewal before it ends its process: shorter than the lease."""
RETRY_PERIOD_SECONDS = 1.0
"""How often the holder renews and a standby reads the Lease."""
JITTER_FACTOR = 1.2
"""client-go's: the renew deadline must leave room for more than one retry period with jitter."""
LOST_EXIT = 3
"""The exit status of a holder that could not renew in time (Kubernetes restarts it, as a standby)."""


def identity(pod: str | None = None) -> str:
    """This process's holder identity: the pod's name (``POD_NAME``, else the host name) and a random suffix,
    so that a restarted container is a new candidate (it waits like any standby) rather than the holder of
    its predecessor's lease. The audit log names the pod of every write in any case."""
    base = pod or os.environ.get("POD_NAME") or os.uname().nodename
    return f"{base}_{uuid.uuid4().hex[:8]}"


def check_timing(duration: float, deadline: float, retry: float) -> None:
    """client-go's rule, ``duration > deadline > retry * JITTER_FACTOR > 0``; else ValueError saying why."""
    if retry <= 0:
        raise ValueError(f"the retry period must be positive, not {retry:g}")
    if deadline <= retry * JITTER_FACTOR:
        raise ValueError(
            f"the renew deadline ({deadline:g} s) must be longer than {JITTER_FACTOR:g} retry periods "
            f"({retry * JITTER_FACTOR:g} s)"
        )
    if duration <= deadline:
        raise ValueError(
            f"the lease duration ({duration:g} s) must be longer than the renew deadline ({deadline:g} s): a "
            "holder that cannot renew must stop before a standby may take over"
        )


@dataclass(frozen=True)
class Record:
    """What the Lease says: who holds it, for how long after each renewal, and when it was last renewed
    (``renew``, as the holder wrote it: compared for change only, never with this clock)."""

    holder: str
    duration: int
    renew: str
    transitions: int = 0


@dataclass(frozen=True)
class Observation:
    """The last record read (``None``: no Lease), and when (``time.monotonic()``) it was first read so."""

    record: Record | None
    since: float


def observe(before: Observation | None, record: Record | None, now: float) -> Observation:
    """The observation after reading ``record`` at ``now``: its clock restarts only when the record changed
    (any field: a holder, a renewal, a release)."""
    if before is not None and before.record == record:
        return before
    return Observation(record, now)


def expired(seen: Observation, now: float) -> bool:
    """May a candidate take the Lease at ``now``? Yes when there is none, when nobody holds it (released),
    or when its record has not changed for its own ``leaseDurationSeconds`` on this reader's clock."""
    record = seen.record
    if record is None or not record.holder:
        return True
    return now - seen.since >= record.duration


def lost(renewed: float, deadline: float, now: float) -> bool:
    """Has the holder that last renewed at ``renewed`` (when it sent that renewal) passed its deadline?"""
    return now - renewed >= deadline


def next_read(seen: Observation, retry: float, now: float) -> float:
    """Seconds a standby waits before it reads again: the retry period, less when the lease expires sooner
    (so that a lost holder is taken over within the lease duration plus one retry period of its loss)."""
    record = seen.record
    if record is None or not record.holder:
        return 0.0
    until = seen.since + record.duration - now
    return max(0.05, min(retry, until + 0.01))


def micro_time(at: dt.datetime) -> str:
    """A Lease's MicroTime (RFC 3339, microseconds, UTC)."""
    return at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record(lease: Any) -> Record:
    spec = lease.spec
    renew = spec.renew_time
    return Record(
        holder=spec.holder_identity or "",
        duration=int(spec.lease_duration_seconds or 0),
        renew=renew.isoformat() if isinstance(renew, dt.datetime) else str(renew or ""),
        transitions=int(spec.lease_transitions or 0),
    )


def _why(exc: BaseException) -> str:
    return f"{exc.status} {exc.reason}" if isinstance(exc, ApiException) else type(exc).__name__


def _exit(code: int) -> None:  # pragma: no cover - ends the process
    logging.shutdown()
    os._exit(code)


class Elector:
    """The Lease ``namespace/name``, held by ``who``: :meth:`acquire`, then renewed in a thread of its own
    until :meth:`release`; a holder past its renew deadline ends the process (``on_lost``)."""

    def __init__(
        self,
        namespace: str,
        name: str,
        who: str,
        *,
        duration: int = LEASE_DURATION_SECONDS,
        deadline: float = RENEW_DEADLINE_SECONDS,
        retry: float = RETRY_PERIOD_SECONDS,
        api: Any = None,
        on_lost: Callable[[int], None] = _exit,
    ) -> None:
        check_timing(duration, deadline, retry)
        self.namespace, self.name, self.who = namespace, name, who
        self.duration, self.deadline, self.retry = duration, deadline, retry
        self._api, self.on_lost = api, on_lost
        self.seen: Observation | None = None
        self.version = ""  # the resourceVersion of the holder's last write: its next one is refused if stale
        self.transitions = 0
        self.acquired_at = ""
        self.renewed = 0.0
        self.holding = threading.Event()
        self.releasing = threading.Event()
        self._threads: list[threading.Thread] = []
        self.where = f"{namespace}/{name}"
        self._timeout = (min(3.0, deadline / 2), max(1.0, deadline / 2))
        """Each request gives up after this long to connect and to answer: a renewal must not hang past the
        deadline (without a timeout, one to a restarted API server hung for a minute, measured)."""

    @property
    def api(self) -> Any:
        if self._api is None:
            import kubernetes

            try:
                kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
            except kubernetes.config.ConfigException:
                kubernetes.config.load_kube_config(os.environ.get("KUBECONFIG"))  # type: ignore[no-untyped-call]
            self._api = kubernetes.client.CoordinationV1Api()
        return self._api

    def _read(self) -> Any:
        return self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self._timeout)

    def _put(self, holder: str, duration: int) -> Any:
        """An update under ``self.version`` (a create without one): the API server refuses it (409) when
        anyone wrote the Lease since."""
        at = micro_time(dt.datetime.now(dt.UTC))
        metadata = {"name": self.name, "namespace": self.namespace, "resourceVersion": self.version or None}
        spec = {
            "holderIdentity": holder or None,
            "leaseDurationSeconds": duration,
            "acquireTime": self.acquired_at or at,
            "renewTime": at,
            "leaseTransitions": self.transitions,
        }
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}
        if not self.version:
            return self.api.create_namespaced_lease(self.namespace, body, _request_timeout=self._timeout)
        return self.api.replace_namespaced_lease(
            self.name, self.namespace, body, _request_timeout=self._timeout
        )

    def try_acquire(self) -> bool:
        """One read of the Lease and, when it has expired on this clock (or is absent, or released), one
        write that takes it: a create, or an update under the resourceVersion read (of two candidates that
        read the same version, the API server refuses the second: 409)."""
        try:
            lease = self._read()
        except ApiException as exc:
            if exc.status != 404:
                raise
            lease = None
        now = time.monotonic()
        record = None if lease is None else _record(lease)
        self.seen = observe(self.seen, record, now)
        # its own identity: a write of this process that succeeded after its answer timed out
        if not expired(self.seen, now) and (record is None or record.holder != self.who):
            return False
        sent, self.acquired_at = time.monotonic(), micro_time(dt.datetime.now(dt.UTC))
        self.version = "" if lease is None else lease.metadata.resource_version
        self.transitions = 0 if record is None else record.transitions + (record.holder != self.who)
        self.version, self.renewed = self._put(self.who, self.duration).metadata.resource_version, sent
        self.holding.set()
        return True

    def acquire(self, stop: threading.Event) -> bool:
        """Wait until this process holds the Lease (True) or ``stop`` is set (False); says once that it
        stands by and each new reason a read or write failed."""
        said, standing_by = "", False
        while not stop.is_set():
            try:
                if self.try_acquire():
                    log.info(
                        "acquired the Lease %s as %s (duration %d s, renew deadline %g s, retry %g s)",
                        self.where, self.who, self.duration, self.deadline, self.retry,
                    )  # fmt: skip
                    return True
                if not standing_by and self.seen is not None and self.seen.record is not None:
                    log.info(
                        "standing by: the Lease %s is held by %s; taking over once it is released, or "
                        "unchanged for %d s on this clock",
                        self.where, self.seen.record.holder, self.seen.record.duration,
                    )  # fmt: skip
                    standing_by = True
            except Exception as exc:  # an answer (409: another candidate wrote first), or no connection
                if _why(exc) != said and not (isinstance(exc, ApiException) and exc.status == 409):
                    log.warning("could not read or take the Lease %s (%s)", self.where, _why(exc))
                said = _why(exc)
                stop.wait(random.uniform(0.5, 1.0) * self.retry)
                continue
            assert self.seen is not None
            stop.wait(next_read(self.seen, self.retry, time.monotonic()))
        return False

    def renew(self) -> None:
        """One renewal: an update under the holder's last resourceVersion. After a 409 (someone wrote) the
        Lease is read again: still this holder's (a label changed), renewed under the new version; another's
        (or nobody's), lost."""
        sent = time.monotonic()
        try:
            written = self._put(self.who, self.duration)
        except ApiException as exc:
            if exc.status != 409:
                raise
            lease = self._read()
            if (holder := _record(lease).holder) != self.who:
                self._lose(f"the Lease is now held by {holder or 'nobody'}")
                return
            self.version = lease.metadata.resource_version
            written = self._put(self.who, self.duration)
        self.version, self.renewed = written.metadata.resource_version, sent

    def may_act(self) -> bool:
        """Holding, not releasing, and within the renew deadline; past it, the process ends (a reconcile
        that wakes from a stall checks this before it writes, not only the watchdog thread)."""
        if self.releasing.is_set() or not self.holding.is_set():
            return False
        if lost(self.renewed, self.deadline, time.monotonic()):
            self._lose(f"no renewal for {time.monotonic() - self.renewed:.1f} s")
            return False
        return True

    def start(self) -> None:
        """Renew every retry period, and watch the deadline, each in a daemon thread."""
        for target, name in ((self._renewing, "ddpjob-lease-renew"), (self._watching, "ddpjob-lease-watch")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _renewing(self) -> None:
        said = ""
        while not self.releasing.is_set():
            wait = self.retry - (time.monotonic() - self.renewed)
            if wait > 0 and self.releasing.wait(wait):
                return
            try:
                self.renew()
                said = ""
            except Exception as exc:  # an answer, a refused or timed-out connection (urllib3's own errors)
                if _why(exc) != said:
                    log.warning(
                        "could not renew the Lease %s (%s); this process ends %g s after its last renewal",
                        self.where, _why(exc), self.deadline,
                    )  # fmt: skip
                    said = _why(exc)
                self.releasing.wait(self.retry / 4)

    def _watching(self) -> None:
        while not self.releasing.wait(min(0.25, self.retry / 4)):
            if lost(self.renewed, self.deadline, time.monotonic()):
                self._lose(f"no renewal for {time.monotonic() - self.renewed:.1f} s")
                return

    def _lose(self, why: str) -> None:
        if self.releasing.is_set():
            return
        self.holding.clear()
        log.error(
            "lost the Lease %s (%s; renew deadline %g s, lease %d s): ending this process (exit %d) before "
            "a standby may act; Kubernetes restarts it as a standby",
            self.where, why, self.deadline, self.duration, LOST_EXIT,
        )  # fmt: skip
        self.on_lost(LOST_EXIT)

    def release(self) -> None:
        """Stop renewing and give the Lease up (holder cleared, duration 1 s, as client-go's
        ReleaseOnCancel): a standby takes over at its next read. Call only once nothing acts any more."""
        held = self.holding.is_set()
        self.releasing.set()
        for thread in self._threads:
            thread.join(timeout=self.deadline)
        if not held or lost(self.renewed, self.deadline, time.monotonic()):
            return  # not ours to clear any more: a standby may hold it already
        try:
            self._put("", 1)
            log.info("released the Lease %s: a standby takes over at once", self.where)
        except Exception as exc:  # 409: someone else wrote; else it expires by itself
            log.warning("could not release the Lease %s (%s): it expires by itself", self.where, _why(exc))
        self.holding.clear()


def serve_healthz(address: str) -> ThreadingHTTPServer:
    """``/healthz`` on ``host:port`` while this process stands by (Kopf serves it once it runs): a standby
    is alive, and the liveness probe must not restart it. :meth:`shutdown` and ``server_close`` it before
    Kopf binds the same port."""
    host, _, port = address.rpartition(":")

    class Healthz(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path.split("?")[0] == "/healthz"
            self.send_response(200 if ok else 404)
            self.end_headers()
            if ok:
                self.wfile.write(b"standing by\n")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Healthz)
    threading.Thread(target=server.serve_forever, name="ddpjob-standby-healthz", daemon=True).start()
    return server
