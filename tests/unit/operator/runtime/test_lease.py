"""One acting replica on a coordination.k8s.io Lease (runtime/lease.py), with client-go's rules: expiry on
the reader's own clock, a renew deadline shorter than the lease, a holder past it ends its process, and a
clean shutdown releases the lease. The decisions are pure; :class:`Elector` is driven against an in-memory
API server that refuses a write under a stale resourceVersion (409), as the real one does."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from ddp_operator import cli
from ddp_operator.runtime import lease
from ddp_operator.runtime.lease import Observation, Record


def held(by: str = "a_1", renew: str = "2026-12-01T00:00:00.000000Z", duration: int = 10) -> Record:
    return Record(holder=by, duration=duration, renew=renew)


def test_expiry_is_judged_on_the_readers_clock_from_when_it_saw_the_record_change() -> None:
    seen = lease.observe(None, held(), now=100.0)
    assert not lease.expired(seen, 109.9)
    assert lease.expired(seen, 110.0)
    # the same record read again does not restart the clock; a renewal (a new renewTime) does
    assert lease.observe(seen, held(), 105.0) is seen
    renewed = lease.observe(seen, held(renew="2026-12-01T00:00:01.000000Z"), 105.0)
    assert renewed.since == 105.0 and not lease.expired(renewed, 114.0) and lease.expired(renewed, 115.0)
    # a writer's wall clock never counts: a renewTime in 1970 or in 2099 is only a change to see
    for renew in ("1970-01-01T00:00:00.000000Z", "2099-01-01T00:00:00.000000Z"):
        odd = lease.observe(seen, held(renew=renew), 105.0)
        assert not lease.expired(odd, 114.0) and lease.expired(odd, 115.0)


def test_a_candidate_that_just_started_waits_a_whole_lease_duration() -> None:
    """It cannot know how old the renewal it first reads is: its clock starts at its first read."""
    first = lease.observe(None, held(duration=10), now=5000.0)
    assert not lease.expired(first, 5009.0) and lease.expired(first, 5010.0)


def test_no_lease_or_a_released_one_is_taken_at_once() -> None:
    assert lease.expired(Observation(None, 0.0), 0.0)
    assert lease.expired(lease.observe(None, held(by="", duration=1), 7.0), 7.0)
    assert lease.next_read(Observation(None, 0.0), 1.0, 0.0) == 0.0


def test_a_standby_reads_every_retry_period_and_right_after_the_lease_expires() -> None:
    seen = lease.observe(None, held(duration=10), now=0.0)
    assert lease.next_read(seen, 1.0, 0.0) == 1.0
    assert lease.next_read(seen, 1.0, 9.5) == pytest.approx(0.51)
    assert lease.next_read(seen, 1.0, 12.0) == 0.05


def test_the_holder_is_lost_at_its_renew_deadline_counted_from_when_it_sent_its_last_renewal() -> None:
    assert not lease.lost(renewed=100.0, deadline=7.0, now=106.9)
    assert lease.lost(renewed=100.0, deadline=7.0, now=107.0)


def test_the_timing_keeps_client_gos_rules() -> None:
    lease.check_timing(10, 7, 1)
    lease.check_timing(lease.LEASE_DURATION_SECONDS, lease.RENEW_DEADLINE_SECONDS, lease.RETRY_PERIOD_SECONDS)
    with pytest.raises(ValueError, match="must be longer than the renew deadline"):
        lease.check_timing(7, 7, 1)
    with pytest.raises(ValueError, match=r"longer than 1.2 retry periods"):
        lease.check_timing(10, 2.4, 2)
    with pytest.raises(ValueError, match="must be positive"):
        lease.check_timing(10, 7, 0)


def test_the_cli_defaults_are_the_modules_and_lease_names_a_namespace_and_a_name() -> None:
    args = cli.build_parser().parse_args(["operator", "--lease=ddpjob-system/ddpjob-operator"])
    assert args.lease == ("ddpjob-system", "ddpjob-operator")
    assert (args.lease_duration, args.renew_deadline, args.retry_period) == (
        lease.LEASE_DURATION_SECONDS,
        lease.RENEW_DEADLINE_SECONDS,
        lease.RETRY_PERIOD_SECONDS,
    )
    assert cli.build_parser().parse_args(["operator"]).lease is None
    for bad in ("ddpjob-operator", "/x", "a/b/c"):
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args(["operator", f"--lease={bad}"])
    # the flags of Kopf's peering are still accepted (ignored, with a warning), so an older command line runs
    older = cli.build_parser().parse_args(["operator", "--priority=auto", "--peering-lifetime=12"])
    assert (older.priority, older.peering_lifetime) == ("auto", "12")


def test_a_holders_identity_is_its_pod_and_a_new_suffix_for_each_process() -> None:
    one, two = lease.identity("op-7f9c-x"), lease.identity("op-7f9c-x")
    assert one.startswith("op-7f9c-x_") and two.startswith("op-7f9c-x_") and one != two


class FakeLeases:
    """The Lease API of an API server: each write gets a new resourceVersion; an update under another one is
    refused with 409, a create of an existing Lease too. ``down``: every request fails (no connection)."""

    def __init__(self) -> None:
        self.body: dict[str, Any] | None = None
        self.version = 0
        self.writes: list[tuple[float, str]] = []
        self.down = False
        self.lock = threading.Lock()

    def _answer(self) -> Any:
        assert self.body is not None
        spec = self.body["spec"]
        return SimpleNamespace(
            metadata=SimpleNamespace(resource_version=str(self.version)),
            spec=SimpleNamespace(
                holder_identity=spec.get("holderIdentity"),
                lease_duration_seconds=spec.get("leaseDurationSeconds"),
                renew_time=spec.get("renewTime"),
                lease_transitions=spec.get("leaseTransitions"),
            ),
        )

    def _write(self, body: dict[str, Any]) -> Any:
        self.version += 1
        self.body = body
        self.writes.append((time.monotonic(), body["spec"].get("holderIdentity") or ""))
        return self._answer()

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> Any:
        with self.lock:
            if self.down:
                raise ConnectionRefusedError
            if self.body is None:
                raise ApiException(status=404, reason="Not Found")
            return self._answer()

    def create_namespaced_lease(self, namespace: str, body: dict[str, Any], **_: Any) -> Any:
        with self.lock:
            if self.down:
                raise ConnectionRefusedError
            if self.body is not None:
                raise ApiException(status=409, reason="AlreadyExists")
            return self._write(body)

    def replace_namespaced_lease(self, name: str, namespace: str, body: dict[str, Any], **_: Any) -> Any:
        with self.lock:
            if self.down:
                raise ConnectionRefusedError
            if body["metadata"].get("resourceVersion") != str(self.version):
                raise ApiException(status=409, reason="Conflict")
            return self._write(body)


def elector(api: FakeLeases, who: str, lost: list[str] | None = None, **timing: Any) -> lease.Elector:
    timing = {"duration": 1, "deadline": 0.5, "retry": 0.1, **timing}
    on_lost = (lambda code: lost.append(f"{who} exit {code}")) if lost is not None else (lambda code: None)
    return lease.Elector("ops", "ddpjob-operator", who, api=api, on_lost=on_lost, **timing)


def test_one_of_two_candidates_acts_and_the_other_takes_over_a_lease_duration_after_its_last_renewal() -> (
    None
):
    api, lost = FakeLeases(), []
    # timings generous enough for a loaded machine: a renewal may be late by a second without any harm
    timing = {"duration": 3, "deadline": 2, "retry": 0.2}
    a, b = elector(api, "a_1", lost, **timing), elector(api, "b_1", lost, **timing)
    stop = threading.Event()
    assert a.acquire(stop) and a.may_act()
    a.start()
    assert not b.try_acquire() and not b.may_act()  # a's lease, fresh on b's clock
    took: list[bool] = []
    standby = threading.Thread(target=lambda: took.append(b.acquire(stop)))
    standby.start()
    time.sleep(4)  # shows that b stands by while a renews: more than a lease duration of b's reads
    assert not took and {who for _, who in api.writes} == {"a_1"}
    # a dies without a word (SIGKILL): its threads stop, nothing is released
    a.releasing.set()
    a.holding.clear()
    died = time.monotonic()
    standby.join(timeout=10)
    assert took == [True] and b.may_act()
    last_of_a = max(at for at, who in api.writes if who == "a_1")
    first_of_b = min(at for at, who in api.writes if who == "b_1")
    assert first_of_b - last_of_a >= 3.0, "b waited a whole lease duration after a's last renewal"
    assert first_of_b - died < 3.0 + 0.2 + 1.0, "within a lease duration and a retry period (and slack)"
    assert api.body is not None and api.body["spec"]["leaseTransitions"] == 1
    assert not lost


def test_a_holder_that_cannot_renew_ends_its_process_before_a_standby_may_act() -> None:
    api, lost = FakeLeases(), []
    a = elector(api, "a_1", lost, duration=2, deadline=1, retry=0.1)
    assert a.acquire(threading.Event())
    a.start()
    time.sleep(0.3)
    api.down = True  # the API server unreachable from a: its renewals fail
    cut = time.monotonic()
    deadline = time.monotonic() + 5
    while not lost and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lost == [f"a_1 exit {lease.LOST_EXIT}"]
    gone = time.monotonic() - cut
    assert gone < 1 + 0.5, f"ended {gone:.2f} s after its renewals began to fail (deadline 1 s)"
    assert not a.may_act()
    a.releasing.set()


def test_a_holder_whose_lease_another_took_stops_at_its_next_renewal() -> None:
    api, lost = FakeLeases(), []
    a = elector(api, "a_1", lost)
    assert a.acquire(threading.Event())
    with api.lock:  # an administrator (or a replica with another clock) writes the lease
        api._write({"metadata": {}, "spec": {"holderIdentity": "x_9", "leaseDurationSeconds": 1}})
    a.renew()
    assert lost == [f"a_1 exit {lease.LOST_EXIT}"]


def test_a_clean_shutdown_releases_the_lease_and_a_standby_takes_over_at_its_next_read() -> None:
    api = FakeLeases()
    a, b = (
        elector(api, "a_1", duration=10, deadline=5, retry=0.2),
        elector(api, "b_1", duration=10, deadline=5),
    )
    assert a.acquire(threading.Event())
    a.start()
    assert not b.try_acquire()
    a.release()
    assert not a.may_act()
    assert api.body is not None and api.body["spec"]["holderIdentity"] is None
    assert api.body["spec"]["leaseDurationSeconds"] == 1
    assert b.try_acquire(), "released: taken at once, not after the 10 s lease"


def test_two_candidates_that_read_the_same_version_cannot_both_take_the_lease() -> None:
    api = FakeLeases()
    a, b = elector(api, "a_1"), elector(api, "b_1")
    real_create = api.create_namespaced_lease

    def create_after_b(namespace: str, body: dict[str, Any], **kw: Any) -> Any:
        api.create_namespaced_lease = real_create  # type: ignore[method-assign]
        assert b.try_acquire()  # b read no lease too, and wrote first
        return real_create(namespace, body, **kw)

    api.create_namespaced_lease = create_after_b  # type: ignore[method-assign]
    with pytest.raises(ApiException) as refused:
        a.try_acquire()
    assert refused.value.status == 409 and not a.may_act() and b.may_act()
