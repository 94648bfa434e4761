"""The typed status (``api/typed_status.py``) and the CRD's status schema are one source: every property has a
field and every field a property; a status reads into the dataclasses and writes back as it was; a value
of a type the schema does not declare reads as absent. That every status the builder writes makes the
round trip is proven with those statuses, in tests/unit/operator/decide/test_status_schema.py."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

import pytest

from ddp_operator.api import typed_status


def _unmatched(cls: Any, node: Mapping[str, Any], path: str) -> list[str]:
    """Every property under ``node`` that no field of ``cls`` reads, and every field whose property the
    schema does not have, recursively through the nested dataclasses (a list's items too)."""
    hints = typing.get_type_hints(cls)
    props, covered, out = node.get("properties") or {}, set(), []
    for f in dataclasses.fields(cls):
        key = typed_status.key(cls, f.name)
        covered.add(key)
        if key not in props:
            out.append(f"{path}: field {cls.__name__}.{f.name} reads {key!r}, which the CRD does not have")
            continue
        kind, sub = typed_status._inner(hints[f.name]), props[key]
        if typing.get_origin(kind) is tuple:
            kind, sub = typing.get_args(kind)[0], sub.get("items") or {}
        if dataclasses.is_dataclass(kind):
            out += _unmatched(kind, sub, f"{path}.{key}")
        elif sub.get("type") == "object":
            out.append(f"{path}.{key}: an object in the CRD, a {kind} in {cls.__name__}")
    out += [
        f"{path}.{p}: in the CRD, read by no field of {cls.__name__}" for p in sorted(set(props) - covered)
    ]
    return out


def test_the_status_type_and_the_crds_status_schema_are_one_source() -> None:
    """A property added to the CRD's status without its field, or a field without its property, fails
    here, naming it."""
    assert _unmatched(typed_status.Status, typed_status.schema(), "status") == []


def test_the_one_source_check_can_fail() -> None:
    @dataclasses.dataclass(frozen=True)
    class Small:
        step: int | None = None
        total: int | None = None

    node = {"properties": {"step": {"type": "integer"}, "etaSeconds": {"type": "integer"}}}
    assert _unmatched(Small, node, "typed_status.progress") == [
        "typed_status.progress: field Small.total reads 'total', which the CRD does not have",
        "typed_status.progress.etaSeconds: in the CRD, read by no field of Small",
    ]


def test_a_status_reads_typed_and_writes_back_as_it_was() -> None:
    written = {
        "phase": "Running",
        "attempt": 2,
        "restartsInPlace": 1,
        "lastRestart": {"kind": "InPlace", "attempt": 2, "inAttempt": 1, "reason": "R", "message": "m"},
        "elastic": {"nodes": 2, "lastResize": {"from": 3, "to": 2, "secondsLost": 7.5}, "counted": {}},
        "conditions": [{"type": "Ready", "status": "True", "reason": "AllNodesReady"}],
        "sync": {"verified": True, "checks": 3, "attempts": [{"attempt": 1, "checks": 3}]},
        "probe": {"faultyNodes": [], "faultyRanks": [3]},
        "progress": {"step": 10, "samplesPerSecond": 640, "loss": 0.25},
        "lastReport": {"attempt": 1, "failures": [{"rank": 0, "at": 1.5, "error": "E"}]},
    }
    typed = typed_status.read(written)
    assert typed.restarts_in_place == 1 and typed.last_restart == typed_status.LastRestart(
        "InPlace", 2, 1, "R", "m"
    )
    assert typed.elastic and typed.elastic.last_resize == typed_status.LastResize(3, 2, seconds_lost=7.5)
    assert typed.condition("Ready") == typed_status.Condition("Ready", "True", "AllNodesReady")
    assert typed.condition("Complete") is None
    assert typed.sync and typed.sync.attempts == (typed_status.SyncAttempt(attempt=1, checks=3),)
    assert typed.probe == typed_status.Probe(faulty_nodes=(), faulty_ranks=(3,))
    assert typed_status.write(typed) == written


@pytest.mark.parametrize(
    "given",
    [
        {"attempt": "2"},
        {"attempt": True},
        {"preemptions": 1.5},
        {"startTime": 5},
        {"sync": "verified"},
        {"sync": {"verified": "yes"}},
        {"unknown": 1},
        {"progress": {"unknown": 1}},
    ],
)
def test_a_value_of_another_type_than_the_schemas_reads_as_absent(given: dict[str, Any]) -> None:
    """A hand-written status the API server would refuse, or fields it would prune: never a crash."""
    typed = typed_status.read(given)
    assert typed_status.write(typed) in ({}, {"sync": {}}, {"progress": {}})


def test_a_list_keeps_its_items_of_the_declared_type() -> None:
    typed = typed_status.read({"probe": {"faultyNodes": ["a", 3, "b"]}, "conditions": "none"})
    assert typed.probe == typed_status.Probe(faulty_nodes=("a", "b")) and typed.conditions is None
    assert typed_status.read(None) == typed_status.read("x") == typed_status.Status()


def test_key_names_the_crd_property() -> None:
    assert typed_status.key(typed_status.Status, "restarts_in_place") == "restartsInPlace"
    assert typed_status.key(typed_status.LastResize, "from_nodes") == "from"
    with pytest.raises(KeyError):
        typed_status.key(typed_status.Status, "restartsInPlace")


def test_a_section_reads_typed_by_its_schema() -> None:
    elastic = typed_status.read_as(typed_status.Elastic, {"nodes": 2, "lastResize": {"from": 3, "to": "x"}})
    assert elastic == typed_status.Elastic(nodes=2, last_resize=typed_status.LastResize(from_nodes=3))
    assert typed_status.read_as(typed_status.Failure, None) == typed_status.Failure()
