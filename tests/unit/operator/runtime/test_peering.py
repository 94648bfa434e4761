"""Replicas of the operator: one acts, the others stand by (Kopf peering). A starting replica claims a
priority below every live one, so the first to announce itself acts and a newer replica never takes over a
live one; without another replica alive it ranks by start time."""

from __future__ import annotations

import argparse
import datetime as dt

import pytest

from ddp_operator import cli
from ddp_operator.runtime import keeper as leases
from ddp_operator.runtime import peering


def test_an_older_replica_outranks_a_newer_one_and_same_millisecond_starts_still_differ() -> None:
    old, new = peering.by_start_time(1_790_000_000.000, 0), peering.by_start_time(1_790_000_000.001, 999)
    assert old > new > 0, "one millisecond later ranks lower, whatever its random digits"
    assert peering.by_start_time(1_790_000_000.0, 1) != peering.by_start_time(1_790_000_000.0, 2)
    assert peering.by_start_time(3_999_999_999.0, 0) > 0, "positive until 2096"
    assert peering.by_start_time(0.0, 999) < 2**63, "a 64-bit integer in the peering object"


def test_priority_is_a_number_or_auto() -> None:
    assert cli._priority("7") == 7
    assert cli._priority("auto") is None, "auto: claimed at start (peering.claim)"
    with pytest.raises(argparse.ArgumentTypeError, match="'high': expected a whole number or 'auto'"):
        cli._priority("high")


NOW = dt.datetime(2026, 11, 28, 12, 0, 0, tzinfo=dt.UTC)


def _record(priority: int, seen_ago: float, lifetime: int = 15) -> dict[str, object]:
    return {
        "priority": priority,
        "lifetime": lifetime,
        "lastseen": (NOW - dt.timedelta(seconds=seen_ago)).isoformat(),
    }


def test_only_other_replicas_whose_records_have_not_expired_are_alive() -> None:
    records = {
        "me": _record(900, 1),
        "live": _record(500, 14),
        "expired": _record(800, 16),
        "long-lived": _record(300, 70, lifetime=75),
        "naive-time": {"priority": 200, "lifetime": 15, "lastseen": "2026-11-28T11:59:59"},
        "unreadable": {"priority": 100, "lastseen": "yesterday"},
        "not-a-record": None,
    }
    assert sorted(peering.live_priorities(records, "me", NOW)) == [200, 300, 500]  # type: ignore[arg-type]


def test_a_replica_claims_below_every_live_one_and_alone_by_start_time() -> None:
    assert peering.claimed_priority([500, 300, 700], 1_790_000_000.0) == 299
    alone = peering.claimed_priority([], 1_790_000_000.0)
    assert peering.by_start_time(1_790_000_000.0, 0) <= alone <= peering.by_start_time(1_790_000_000.0, 999)


def test_the_identity_is_kopfs_form_and_differs_between_two_starts_in_the_same_second() -> None:
    one, two = peering.identity(1_790_000_000.0), peering.identity(1_790_000_000.0)
    host, started, letters = one.split("/")
    assert started == "20260921141320" and len(letters) == 3 and host
    assert len({peering.identity(1_790_000_000.0) for _ in range(50)}) > 1 and one.count("/") == two.count(
        "/"
    )


def test_a_renewal_touches_only_this_replicas_record_and_only_while_it_is_there() -> None:
    """Kopf's identities hold slashes (host/start/letters): escaped in the pointer, so the patch reaches
    the record; a ``test`` of the priority first, so that a record Kopf removed (at shutdown) or a peer
    cleaned away is not put back by a late renewal."""
    own = "op-7c9d/20261128120000/a~b"
    assert leases.pointer(own) == "/status/op-7c9d~120261128120000~1a~0b"
    assert leases.renewal(own, 42, NOW) == [
        {"op": "test", "path": "/status/op-7c9d~120261128120000~1a~0b/priority", "value": 42},
        {"op": "replace", "path": "/status/op-7c9d~120261128120000~1a~0b/lastseen", "value": NOW.isoformat()},
    ]


def test_a_replica_that_cannot_renew_fences_itself_before_its_record_expires_and_acts_again_after_renewals(
    caplog: pytest.LogCaptureFixture,
) -> None:
    keeper = leases.Keeper([], "me/1/abc", 1, lifetime=15)
    start = keeper.renewed
    keeper.check(start + 10.9)
    assert not keeper.fenced.is_set()
    keeper.check(start + 11.1)  # 15 s lifetime less the 4 s margin: a standby may act 3.9 s from now
    assert keeper.fenced.is_set() and "making no writes until it is renewed" in caplog.text
    for renewals in range(1, leases.UNFENCE_RENEWALS + 1):
        keeper.renewals += 1
        keeper.renewed = start + 10 + renewals
        keeper.check(keeper.renewed)
        assert keeper.fenced.is_set() == (renewals < leases.UNFENCE_RENEWALS), renewals
    assert "renewed again: acting as before" in caplog.text


def test_a_replica_acts_only_while_no_record_of_higher_priority_is_alive_at_that_moment(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The keeper's own check beside Kopf's pause: the records its last renewal read, their expiry computed
    at each call, so a lost leader's record stops outranking the standby the moment it expires."""
    keeper = leases.Keeper(["jobs"], "standby/1/abc", 5, lifetime=12)
    keeper.records = {
        "jobs/leader/0/xyz": _record(9, seen_ago=0, lifetime=12),
        "jobs/standby/1/abc": _record(5, seen_ago=0, lifetime=12),
        "jobs/newer/2/def": _record(4, seen_ago=0, lifetime=12),
    }
    assert keeper.outranked(NOW) == (9,)
    assert keeper.outranked(NOW + dt.timedelta(seconds=11.9)) == (9,)
    assert keeper.outranked(NOW + dt.timedelta(seconds=12.1)) == ()  # the leader's record expired
    keeper.records["jobs/leader/0/xyz"] = {  # renewed just now (may_act reads the clock)
        "priority": 9,
        "lifetime": 12,
        "lastseen": dt.datetime.now(dt.UTC).isoformat(),
    }
    assert not keeper.may_act() and "a replica of higher priority (9) is alive" in caplog.text
    del keeper.records["jobs/leader/0/xyz"]
    assert keeper.may_act()
    keeper.fenced.set()
    assert not keeper.may_act()


def test_a_record_removed_from_the_object_is_remembered_until_it_expires() -> None:
    """Kopf's autoclean removes a record it judged dead, and a replica whose watch lagged judged a live one
    dead: the keeper keeps what it read until the record's own expiry; only a later lastseen replaces it."""
    leader = _record(9, seen_ago=5, lifetime=12)
    known = leases.remembered({}, {"jobs/leader": leader}, NOW)
    assert leases.remembered(known, {}, NOW) == {"jobs/leader": leader}  # removed, 7 s still to live
    assert leases.remembered(known, {}, NOW + dt.timedelta(seconds=7.1)) == {}  # expired
    older = _record(9, seen_ago=8, lifetime=12)
    assert leases.remembered(known, {"jobs/leader": older}, NOW) == {"jobs/leader": leader}
    newer = _record(9, seen_ago=1, lifetime=12)
    assert leases.remembered(known, {"jobs/leader": newer}, NOW) == {"jobs/leader": newer}
