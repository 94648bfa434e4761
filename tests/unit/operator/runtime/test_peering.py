"""Replicas of the operator: one acts, the others stand by (Kopf peering). Their priorities fall with the
start time, so the oldest acts and a newer replica never takes over a live one."""

from __future__ import annotations

import argparse

import pytest

from ddp_operator import cli
from ddp_operator.runtime import peering


def test_an_older_replica_outranks_a_newer_one_and_same_millisecond_starts_still_differ() -> None:
    old, new = peering.by_start_time(1_790_000_000.000, 0), peering.by_start_time(1_790_000_000.001, 999)
    assert old > new > 0, "one millisecond later ranks lower, whatever its random digits"
    assert peering.by_start_time(1_790_000_000.0, 1) != peering.by_start_time(1_790_000_000.0, 2)
    assert peering.by_start_time(3_999_999_999.0, 0) > 0, "positive until 2096"
    assert peering.by_start_time(0.0, 999) < 2**63, "a 64-bit integer in the peering object"


def test_priority_is_a_number_or_auto() -> None:
    assert cli._priority("7") == 7
    assert cli._priority("auto") > peering.by_start_time(3_999_999_999.0, 999)
    with pytest.raises(argparse.ArgumentTypeError, match="'high': expected a whole number or 'auto'"):
        cli._priority("high")
