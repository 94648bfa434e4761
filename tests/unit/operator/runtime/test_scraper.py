"""scraper: reads in the background, once per job at a time, no sooner than the interval; a pod that
does not answer is named, and read again only after the retry interval."""

from __future__ import annotations

import threading
import time
import urllib.error

from ddp_operator.observe.live import Target
from ddp_operator.runtime import scraper

TEXT = 'ddp_step{rank="0"} 7.0\nddp_samples_total{rank="0"} 70.0\n'
TARGETS = (Target("p-0", 0, "http://10.0.0.1:9400/metrics"), Target("p-1", 1, "http://10.0.0.2:9400/metrics"))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _wait(reader: scraper.Scraper, key: tuple[str, str], at: float) -> None:
    deadline = time.monotonic() + 5
    while (found := reader.latest(key)) is None or found.at < at:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_reads_in_the_background_and_names_pods_that_do_not_answer() -> None:
    calls: list[str] = []
    release = threading.Event()

    def fetch(url: str) -> str:
        calls.append(url)
        release.wait(5)
        if "10.0.0.2" in url:
            raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
        return TEXT

    clock = Clock()
    reader = scraper.Scraper(fetch, clock=clock)
    key = ("ns", "job")
    assert reader.want(key, 1, 9400, TARGETS) is True
    assert reader.want(key, 1, 9400, TARGETS) is False  # one read at a time per job; want() never waits
    release.set()
    _wait(reader, key, clock.now)
    snap = reader.latest(key)
    assert snap is not None and snap.latest is not None and snap.latest.step == 7
    assert snap.refused == ("p-1",) and snap.unreachable == ()
    clock.now += 5
    assert reader.want(key, 1, 9400, TARGETS) is False  # too soon
    clock.now += scraper.EVERY_SECONDS
    assert reader.want(key, 1, 9400, TARGETS) is True
    reader.forget(key)
    reader.shutdown()


def test_a_job_whose_pods_do_not_answer_is_read_again_only_after_the_retry_interval() -> None:
    def fetch(url: str) -> str:
        raise TimeoutError("timed out")

    clock = Clock()
    reader = scraper.Scraper(fetch, clock=clock)
    key = ("ns", "quiet")
    assert reader.want(key, 1, 9400, TARGETS)
    _wait(reader, key, clock.now)
    snap = reader.latest(key)
    assert (
        snap is not None and snap.latest is None and snap.unreachable == ("p-0: timed out", "p-1: timed out")
    )
    clock.now += scraper.EVERY_SECONDS + 1
    assert reader.want(key, 1, 9400, TARGETS) is False
    clock.now += scraper.RETRY_SECONDS
    assert reader.want(key, 1, 9400, TARGETS) is True
    assert reader.want(("ns", "other"), 1, 9400, ()) is False  # nothing to read
    reader.shutdown()
