"""A DDPJob's status, typed: frozen dataclasses read from the CRD's status schema by name, as ``Spec`` is
from its spec schema (:mod:`ddp_operator.api.spec`).

Each field is its CRD property in snake_case (``restarts_in_place`` is ``status.restartsInPlace``), by the
same rule as the spec's (:func:`~ddp_operator.api.crd_fields.crd_key`); a property that is a Python keyword
says its key (``from_nodes`` is ``from``). Every field may be absent (None), since a status is written a piece
at a time; a list is a tuple. :func:`read` takes a status as the API server stores it, or as the builder
(``decide/status_builder``) writes it, and keeps each value of the type the schema declares, so a hand-written
value of another type reads as absent; :func:`write` gives the mapping back, the absent fields left out:
``write(read(s)) == s`` for every status the builder writes (proven in
tests/unit/operator/decide/test_status_schema.py). The fields are in the CRD's order, and
tests/unit/operator/api/test_typed_status.py proves that every property has a field and every field a
property.

Long because the dataclasses mirror the CRD's status one to one; the logic is :func:`read` and
:func:`write`.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from ddp_operator.api import crd, reasons
from ddp_operator.api.crd_fields import crd_key


@dataclass(frozen=True)
class Condition:
    type: str | None = None
    status: str | None = None
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = None


@dataclass(frozen=True)
class LastRestart:
    """``status.lastRestart``: the last gang restart, in place or by a new Job."""

    kind: str | None = None
    attempt: int | None = None
    in_attempt: int | None = None
    reason: str | None = None
    message: str | None = None
    time: str | None = None


@dataclass(frozen=True)
class LastResize:
    from_nodes: int | None = field(default=None, metadata={"key": "from"})
    to_nodes: int | None = field(default=None, metadata={"key": "to"})
    reason: str | None = None
    time: str | None = None
    seconds_lost: float | None = None
    mode: str | None = None
    steps_lost: int | None = None
    bytes_sent: int | None = None


@dataclass(frozen=True)
class Counted:
    job: str | None = None
    round: int | None = None


@dataclass(frozen=True)
class Elastic:
    """``status.elastic``: an elastic job's size and resizes (:mod:`ddp_operator.decide.resize`)."""

    nodes: int | None = None
    nodes_from: str | None = None
    desired: int | None = None
    min_nodes: int | None = None
    max_nodes: int | None = None
    resizes: int | None = None
    summary: str | None = None
    last_resize: LastResize | None = None
    counted: Counted | None = None
    below_min_since: str | None = None


@dataclass(frozen=True)
class SyncAttempt:
    attempt: int | None = None
    checks: int | None = None
    mismatches: int | None = None
    repairs: int | None = None
    worlds: int | None = None
    resumed_from_step: int | None = None


@dataclass(frozen=True)
class Sync:
    """``status.sync``: the sync checks over the whole job, each attempt's in ``attempts``."""

    verified: bool | None = None
    checks: int | None = None
    mismatches: int | None = None
    repairs: int | None = None
    attempts: tuple[SyncAttempt, ...] | None = None
    last_check_step: int | None = None
    last_check_time: str | None = None
    last_check_result: str | None = None


@dataclass(frozen=True)
class Probe:
    """``status.probe``: the compute probe's finding, and the nodes later attempts avoid."""

    faulty_nodes: tuple[str, ...] | None = None
    faulty_ranks: tuple[int, ...] | None = None
    attempt: int | None = None
    message: str | None = None
    last_verdict: str | None = None
    last_why: str | None = None


@dataclass(frozen=True)
class Progress:
    step: int | None = None
    total_steps: int | None = None
    percent: int | None = None
    summary: str | None = None
    samples_per_second: float | None = None
    steps_per_second: float | None = None
    eta_seconds: int | None = None
    eta: str | None = None
    eta_time: str | None = None
    computed_at: str | None = None
    loss: float | None = None
    nonfinite_loss_steps: int | None = None
    slowest_rank: int | None = None
    slowest_step_seconds: float | None = None
    step_time_skew: float | None = None
    unreachable: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Failure:
    rank: int | None = None
    at: float | None = None
    restart: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class LastReport:
    """``status.lastReport``: what the operator keeps of rank 0's report once its pod is gone."""

    attempt: int | None = None
    result: str | None = None
    reason: str | None = None
    message: str | None = None
    failures: tuple[Failure, ...] | None = None


@dataclass(frozen=True)
class Kueue:
    workload: str | None = None
    admitted: bool | None = None
    cluster_queue: str | None = None
    evictions: int | None = None


@dataclass(frozen=True)
class Checkpoint:
    resumed_from_step: int | None = None
    warm_started_from: str | None = None
    skipped: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Status:
    """One DDPJob's status. Field meanings: ``kubectl explain ddpjob.status``."""

    phase: str | None = None
    attempt: int | None = None
    restarts: int | None = None
    restarts_in_place: int | None = None
    last_restart: LastRestart | None = None
    ready_nodes: int | None = None
    selector: str | None = None
    elastic: Elastic | None = None
    start_time: str | None = None
    completion_time: str | None = None
    observed_generation: int | None = None
    conditions: tuple[Condition, ...] | None = None
    sync: Sync | None = None
    probe: Probe | None = None
    progress: Progress | None = None
    last_report: LastReport | None = None
    preemptions: int | None = None
    kueue: Kueue | None = None
    checkpoint: Checkpoint | None = None

    def condition(self, kind: str) -> Condition | None:
        """The condition of type ``kind``, if the status has one (the last, should it have two)."""
        return next((c for c in reversed(self.conditions or ()) if c.type == kind), None)


@functools.cache
def schema() -> Mapping[str, Any]:
    """The CRD's status schema."""
    node: Mapping[str, Any] = crd.openapi_schema()["properties"]["status"]
    return node


def read(mapping: Mapping[str, Any] | None) -> Status:
    """The typed status of ``mapping`` (a DDPJob's ``status``; None or a non-mapping: an empty one)."""
    typed: Status = _read(Status, mapping if isinstance(mapping, Mapping) else {}, schema())
    return typed


def finished(status: Mapping[str, Any] | Status) -> bool:
    """A terminal phase, with what this operator writes along with one: a completionTime and a True
    Complete or Failed condition. A phase without them (a hand-edited status) is not believed: the next
    decision repairs it from the children. ``status``: as stored (read typed here), or typed."""
    typed = status if isinstance(status, Status) else read(status)
    said = [c for c in typed.conditions or () if c.type in ("Complete", "Failed") and c.status == "True"]
    return typed.phase in reasons.TERMINAL and bool(typed.completion_time) and bool(said)


def read_as(cls: type, mapping: Any) -> Any:
    """A section of the status typed (``read_as(Elastic, mapping)``; not a mapping: an empty one)."""
    return _read(cls, mapping if isinstance(mapping, Mapping) else {}, _nodes()[cls])


@functools.cache
def _nodes() -> dict[type, Mapping[str, Any]]:
    """Each dataclass of the status → its schema node."""
    found: dict[type, Mapping[str, Any]] = {Status: schema()}

    def walk(cls: type, node: Mapping[str, Any]) -> None:
        for name, prop in _keys(cls):
            kind, sub = _inner(_hints(cls)[name]), (node.get("properties") or {}).get(prop) or {}
            if typing.get_origin(kind) is tuple:
                kind, sub = typing.get_args(kind)[0], sub.get("items") or {}
            if is_dataclass(kind) and isinstance(kind, type):
                found[kind] = sub
                walk(kind, sub)

    walk(Status, schema())
    return found


def write(value: Any) -> dict[str, Any]:
    """A status dataclass (or a section's) as the mapping the API server stores: absent fields left out."""
    kind: type = type(value)
    return {prop: _out(item) for f, prop in _keys(kind) if (item := getattr(value, f)) is not None}


def key(cls: type, name: str) -> str:
    """The CRD property of field ``name`` of ``cls`` (``key(Status, "restarts_in_place")``:
    ``"restartsInPlace"``); a name that is not a field is a ``KeyError``."""
    return keys(cls)[name]


def keys(cls: type) -> Mapping[str, str]:
    """Each field of ``cls`` by name → its CRD property."""
    return dict(_keys(cls))


@functools.cache
def _keys(cls: type) -> tuple[tuple[str, str], ...]:
    return tuple((f.name, str(crd_key(f))) for f in fields(cls))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _read(cls: Any, mapping: Mapping[str, Any], node: Mapping[str, Any]) -> Any:
    hints = _hints(cls)
    properties = node.get("properties") or {}
    out = {}
    for name, prop in _keys(cls):
        if prop in mapping and prop in properties:
            out[name] = _value(_inner(hints[name]), mapping[prop], properties[prop])
    return cls(**out)


def _inner(kind: Any) -> Any:
    """The type a field holds when present (its hint without ``| None``)."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return args[0] if type(None) in typing.get_args(kind) and len(args) == 1 else kind


def _value(kind: Any, value: Any, node: Mapping[str, Any]) -> Any:
    """``value`` as field type ``kind`` when it has the schema's type, else None (absent)."""
    declared = node.get("type")
    if isinstance(value, bool) and declared != "boolean":
        return None
    if declared == "integer":
        return value if isinstance(value, int) else None
    if declared == "number":
        return value if isinstance(value, int | float) else None
    if declared == "string":
        return value if isinstance(value, str) else None
    if declared == "boolean":
        return value if isinstance(value, bool) else None
    if declared == "object" and is_dataclass(kind):
        return _read(kind, value, node) if isinstance(value, Mapping) else None
    if declared == "array" and isinstance(value, list):
        (item_kind, _) = typing.get_args(kind)
        items = (_value(item_kind, item, node.get("items") or {}) for item in value)
        return tuple(item for item in items if item is not None)
    return None


def _out(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return write(value)
    if isinstance(value, tuple):
        return [_out(item) for item in value]
    return value
