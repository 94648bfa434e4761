"""Reads the trainer's ``/metrics`` from a running DDPJob's pods, outside any reconcile. The I/O half of
:mod:`ddp_operator.observe.live`.

A reconcile's plan names the pods to read (:attr:`~ddp_operator.decide.plan.Plan.scrape`);
:meth:`Scraper.want` queues one read per job when the last is old enough and none is under way, and returns at
once; a small thread pool does the reads (``http://<podIP>:<metricsPort>/metrics``, no token: the pod network,
as a cluster's Prometheus reaches them); the next reconcile finds the
:class:`~ddp_operator.observe.live.Snapshot`. Each read times out after :data:`TIMEOUT_SECONDS` and stops at
:data:`metrics.SIZE_LIMIT` bytes; a job whose pods did not answer in time is read again only after
:data:`RETRY_SECONDS`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
import urllib.error
from collections.abc import Callable, Sequence

from ddp_operator.observe import live, metrics
from ddp_operator.observe.live import Target

log = logging.getLogger(__name__)
Key = tuple[str, str]
EVERY_SECONDS = 10.0
RETRY_SECONDS = 30.0
TIMEOUT_SECONDS = 2.0


def _ask(target: Target, fetch: Callable[[str], str]) -> live.Answer:
    try:
        return live.Answer(target.pod, fetch(target.url))
    except urllib.error.URLError as exc:
        refused = isinstance(exc.reason, ConnectionRefusedError)
        return live.Answer(target.pod, None, refused=refused, error=str(exc.reason))
    except (OSError, ValueError) as exc:
        refused = isinstance(exc, ConnectionRefusedError)
        return live.Answer(target.pod, None, refused=refused, error=str(exc) or type(exc).__name__)


class Scraper:
    """The latest snapshot per DDPJob, refreshed in the background."""

    def __init__(
        self,
        fetch: Callable[[str], str] = lambda url: metrics.fetch(url, timeout=TIMEOUT_SECONDS),
        workers: int = 4,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._fetch, self._clock = fetch, clock
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="ddpjob-scrape")
        self._lock = threading.Lock()
        self._latest: dict[Key, live.Snapshot] = {}
        self._busy: set[Key] = set()

    def latest(self, key: Key) -> live.Snapshot | None:
        with self._lock:
            return self._latest.get(key)

    def forget(self, key: Key) -> None:
        with self._lock:
            self._latest.pop(key, None)

    def want(self, key: Key, attempt: int, port: int, targets: Sequence[Target]) -> bool:
        """Queue a read of ``targets`` unless one is under way or the last is recent; never blocks."""
        with self._lock:
            last = self._latest.get(key)
            if key in self._busy or not targets:
                return False
            if last is not None and last.attempt == attempt:
                # A refused connection costs nothing (the trainer may not listen yet); a silent pod does.
                wait = RETRY_SECONDS if last.latest is None and last.unreachable else EVERY_SECONDS
                if self._clock() - last.at < wait:
                    return False
            self._busy.add(key)
        self._pool.submit(self._read, key, attempt, port, tuple(targets))
        return True

    def _read(self, key: Key, attempt: int, port: int, targets: tuple[Target, ...]) -> None:
        try:
            answers = [_ask(target, self._fetch) for target in targets]
            texts = [a.text for a in answers if a.text is not None]
            latest = None
            try:
                latest = metrics.parse(texts) if texts else None
            except ValueError as exc:  # not Prometheus text: say so, as for a pod that did not answer
                answers = [live.Answer(a.pod, None, error=f"unreadable metrics: {exc}") for a in answers]
            with self._lock:
                previous = self._latest.get(key)
                self._latest[key] = live.record(previous, attempt, port, answers, self._clock(), latest)
        except Exception:  # a background thread: log, never die silently
            log.exception("reading the metrics of %s/%s failed", *key)
        finally:
            with self._lock:
                self._busy.discard(key)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
