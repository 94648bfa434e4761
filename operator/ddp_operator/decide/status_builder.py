"""The one builder of a DDPJob's status: :class:`StatusBuilder` writes the status's mapping, with stable
condition transition times and the events that go with it, naming each field as
:class:`~ddp_operator.api.typed_status.Status` does and reading the status before (and what it wrote so far)
typed; :func:`stamp`, :func:`parse_time` and :func:`count` read and write its times and counts (whether a
status is a finished job's, :func:`~ddp_operator.api.typed_status.finished`, is read where it is typed).

:mod:`ddp_operator.decide.status` (the beginning and the end of the status) and the rooms of
``decide/`` (each feature's part) say what each source writes through it; no other module of ``decide/``
spells a status key (tests/contract/test_status_keys.py).

Long because the builder, what a room says to it (:class:`Said`, a section as its :class:`Parts`) and the
sections it writes (:class:`Section`) are one vocabulary, read best in one place.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, is_dataclass
from typing import Any

from ddp_operator.api import reasons, typed_status
from ddp_operator.api.typed_status import Condition, Status
from ddp_operator.api.typed_status import finished as finished
from ddp_operator.decide.plan import Event, Obj, Plan

KEYS = typed_status.keys(Status)
"""Each field of the status by its name in :class:`Status` → its key in the mapping."""
SECTION_KEYS: dict[type, Mapping[str, str]] = {
    kind: typed_status.keys(kind)
    for kind in (
        typed_status.Elastic,
        typed_status.Kueue,
        typed_status.LastResize,
        typed_status.Probe,
        typed_status.Progress,
        typed_status.Sync,
        Status,
    )
}
"""The same for each section the builder writes field by field (:class:`Section`)."""


def of(body: Mapping[str, Any]) -> dict[str, Any]:
    """A DDPJob's status as last written (a copy; {} before the first write)."""
    return dict(body.get("status") or {})


def stamp(moment: dt.datetime) -> str:
    """RFC 3339 in UTC, as the API server writes times."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: Any) -> dt.datetime | None:
    """A time the status holds (RFC 3339), or None when it holds none or an unreadable one."""
    if not isinstance(text, str):
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _written(value: Any) -> Any:
    """A field's value as the status holds it: a section's dataclass as its mapping, a section said as its
    parts (:class:`Parts`) as :meth:`Section.of` writes them, a time as :func:`stamp` writes it."""
    if isinstance(value, Parts):
        return Section.of(value.kind, *value.parts, stored=value.stored)
    if is_dataclass(value):
        return typed_status.write(value)
    return stamp(value) if isinstance(value, dt.datetime) else value


def count(value: Any) -> int:
    """A count from the status: a non-negative integer (anything else, hand-written, counts as 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass(frozen=True)
class Parts:
    """A section a room says as its parts (``kind``: its dataclass; each part its fields by name, in order;
    ``stored``: the section as stored, gone on from), which the builder writes as :meth:`Section.of` does,
    when it writes what the room said: the room hands it over in the value it says."""

    kind: type
    parts: tuple[Mapping[str, Any], ...]
    stored: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Said:
    """What a room says of the status, as one value: :meth:`StatusBuilder.say` applies it in this order (the
    fields set, by their names in :class:`Status` and in this order; the fields kept, the sections gone on
    from; the fields dropped; the previous
    status's conditions kept; the conditions said; the phase; the events), so a room enters the builder
    once."""

    fields: Mapping[str, Any] = field(default_factory=dict)
    keep: tuple[str, ...] = ()
    """Fields of the previous status kept as they were stored, when they have a value (after ``fields``)."""
    go_on: tuple[str, ...] = ()
    """Sections of the previous status gone on from: each copied, when it is stored as a mapping (even an
    empty one; after ``keep``)."""
    drop: tuple[str, ...] = ()
    keep_conditions: tuple[str, ...] = ()
    conditions: tuple[tuple[str, bool | None, str, str], ...] = ()
    """(kind, status, reason, message) of each, as :meth:`StatusBuilder.condition` takes them."""
    phase: tuple[str, str, str, bool] | None = None
    """(phase, reason, message, warning), as :meth:`StatusBuilder.phase` takes them."""
    events: tuple[Event, ...] = ()


@dataclass
class StatusBuilder:
    """The status under construction, with the conditions and events that go with it: the one place
    that writes the status's mapping. Its fields are named as :class:`~ddp_operator.api.typed_status.Status`
    names them (:meth:`set`, :meth:`keep`, :meth:`drop`; a time is written as :func:`stamp` writes it);
    what it read and what it wrote so far are typed (:attr:`last`, :meth:`current`). A section kept from
    the previous status is copied as stored, its keys in their order, so the status written is the same
    JSON for the same inputs."""

    previous: Mapping[str, Any]
    now: str
    values: Obj = field(default_factory=dict)
    conditions: dict[str, Obj] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    last: Status = field(init=False, repr=False)
    """The previous status, typed: read once, as the builder is made."""
    counted: tuple[int, int] = field(init=False, repr=False)
    """The previous status's preemptions and restarts in place (:func:`count`)."""

    def __post_init__(self) -> None:
        self.last = typed_status.read(self.previous)
        self.counted = count(self.last.preemptions), count(self.last.restarts_in_place)

    @classmethod
    def for_body(cls, body: Mapping[str, Any], now: dt.datetime) -> StatusBuilder:
        """The builder of DDPJob ``body``'s next status (:func:`of`), at ``now``."""
        return cls(of(body), stamp(now))

    @functools.cached_property
    def _said(self) -> dict[str | None, Condition]:
        return {c.type: c for c in self.last.conditions or ()}

    def said(self, kind: str) -> Condition | None:
        """The previous status's condition ``kind`` (the last, should it have two), typed."""
        return self._said.get(kind)

    def current(self) -> Status:
        """The status written so far, typed (its conditions apart: :attr:`conditions`)."""
        return typed_status.read(self.values)

    def set(self, **fields: Any) -> None:
        """Write status fields by their names in :class:`Status` (``ready_nodes=2`` is ``readyNodes``), in
        this order; a section given as its dataclass is written as its mapping, a time (``datetime``) as
        :func:`stamp` writes it."""
        for name, value in fields.items():
            self.values[KEYS[name]] = _written(value)

    def say(self, *saids: Said) -> None:
        """Write what each room said (:class:`Said`), in this order."""
        for said in saids:
            self.set(**said.fields)
            self.keep(*said.keep)
            for name in said.go_on:
                if isinstance(stored := self.stored(name), dict):
                    self.values[KEYS[name]] = dict(stored)
            for name in said.drop:
                self.drop(name)
            if said.keep_conditions:
                self.keep_conditions(*said.keep_conditions)
            for kind, status, reason, message in said.conditions:
                self.condition(kind, status, reason, message)
            if said.phase is not None:
                self.phase(*said.phase)
            self.events.extend(said.events)

    def drop(self, name: str) -> None:
        """Leave field ``name`` out of the status."""
        self.values.pop(KEYS[name], None)

    def keep(self, *names: str) -> None:
        """Keep each field of the previous status that has a value, as it was stored."""
        for name in names:
            prop = KEYS[name]
            if self.previous.get(prop):
                self.values[prop] = self.previous[prop]

    def stored(self, name: str, *, written: bool = False) -> Any:
        """Field ``name`` as the previous status stores it (``written``: as written so far), untyped: a
        section the builder goes on from, keeping its keys' order."""
        return (self.values if written else self.previous).get(KEYS[name])

    def section(self, name: str, kind: type, fields: Mapping[str, Any], keep: tuple[str, ...] = ()) -> Obj:
        """Section ``name`` (of ``kind``) begun at once: ``fields``, then those of ``keep`` as stored."""
        stored, props = self.stored(name), SECTION_KEYS[kind]
        kept = {k: stored[props[k]] for k in keep if isinstance(stored, Mapping) and props[k] in stored}
        return Section.of(kind, fields, kept)

    def keep_all_but_conditions(self) -> None:
        """Every field of the previous status as stored, but its conditions (a refused spec's)."""
        self.values.update({k: v for k, v in self.previous.items() if k != "conditions"})

    def condition(self, kind: str, status: bool | None, reason: str, message: str) -> None:
        self.conditions[kind] = self._condition(kind, status, reason, message)

    def _condition(self, kind: str, status: bool | None, reason: str, message: str) -> Obj:
        """Condition ``kind`` as written: its transition time kept while its status stays."""
        value = "Unknown" if status is None else str(status)
        old = self.said(kind)
        since = old.last_transition_time if old is not None and old.status == value else self.now
        return {
            "type": kind,
            "status": value,
            "reason": reason,
            "message": message,
            "lastTransitionTime": since or self.now,
        }

    def keep_conditions(self, *kinds: str) -> None:
        """The previous status's conditions of these kinds (no kinds: all of them), as they were."""
        old = {c.get("type"): c for c in self.previous.get("conditions", []) or []}
        for kind in kinds or tuple(old):
            if old.get(kind):
                self.conditions[kind] = dict(old[kind])

    def since(self, kind: str) -> str:
        """When condition ``kind``, as written, took its status."""
        return str(self.conditions[kind]["lastTransitionTime"])

    def changed_at(self, kind: str) -> dt.datetime | None:
        """:meth:`since`, read as a time (None: unreadable)."""
        return parse_time(self.since(kind))

    def phase(self, phase: str, reason: str, message: str, warning: bool = False) -> None:
        self.values["phase"] = phase
        ready = self.said(reasons.READY)
        if self.last.phase != phase or (ready.reason if ready is not None else None) != reason:
            self.events.append(Event("Warning" if warning else "Normal", reason, message))

    def plan(self, *saids: Said, **steps: Any) -> Plan:
        """The plan: what the rooms said last (:meth:`say`), then this status, its events and ``steps``."""
        self.say(*saids)
        status = {**self.values, "conditions": [self.conditions[k] for k in sorted(self.conditions)]}
        return Plan(status, events=tuple(self.events), **steps)

    def add_to(self, plan: Plan, said: Said) -> Plan:
        """``plan`` (this builder's) with the conditions ``said`` (in place of its own of the same kinds,
        said as :meth:`condition` says them) and its events added: a room that speaks once the plan is
        made."""
        said_now = {c[0]: self._condition(*c) for c in said.conditions}
        kept = [c for c in plan.status.get("conditions", []) if c.get("type") not in said_now]
        conditions = sorted([*kept, *said_now.values()], key=lambda c: str(c.get("type")))
        status = {**plan.status, "conditions": conditions}
        return dataclasses.replace(plan, status=status, events=(*plan.events, *said.events))


@dataclass
class Section:
    """A section of the status under construction (``status.elastic``: ``Section(Elastic)``), written as
    a mapping by the names of its dataclass's fields (:mod:`ddp_operator.api.typed_status`), its keys in the
    order first written, and read back typed."""

    kind: type
    values: Obj = field(default_factory=dict)

    @classmethod
    def of(cls, kind: type, *parts: Mapping[str, Any], stored: Mapping[str, Any] | None = None) -> Obj:
        """Section ``kind`` written at once: ``stored`` (as stored, its keys in their order), then each of
        ``parts``' fields by name, in order."""
        section = cls(kind, dict(stored or {}))
        for fields in parts:
            section.set(**fields)
        return section.values

    def set(self, **fields: Any) -> None:
        """Write fields by name; a dataclass is written as its mapping, a time as :func:`stamp` writes it."""
        for name, value in fields.items():
            self.values[SECTION_KEYS[self.kind][name]] = _written(value)

    def typed(self) -> Any:
        """What is written so far, typed."""
        return typed_status.read_as(self.kind, self.values)

    def stored(self, name: str) -> Any:
        """Field ``name`` as written, untyped (a mapping to go on from, its keys in their order)."""
        return self.values.get(SECTION_KEYS[self.kind][name])

    def has(self, name: str) -> bool:
        """Whether field ``name`` is written (whatever its value)."""
        return SECTION_KEYS[self.kind][name] in self.values

    def drop(self, *names: str) -> None:
        """Leave these fields out."""
        for name in names:
            self.values.pop(SECTION_KEYS[self.kind][name], None)

    def keep(self, stored: Any, name: str) -> None:
        """Field ``name`` of ``stored`` (the same section, as the previous status stores it), as it is
        stored, when it has that field."""
        prop = SECTION_KEYS[self.kind][name]
        if isinstance(stored, Mapping) and prop in stored:
            self.values[prop] = stored[prop]

    def with_field(self, name: str, section: type, field_name: str, value: Any) -> None:
        """Field ``name``, a mapping as written, with its field ``field_name`` (of dataclass ``section``)
        set to ``value``: its other keys kept in their order."""
        current = self.stored(name)
        kept = dict(current) if isinstance(current, Mapping) else {}
        kept[SECTION_KEYS[section][field_name]] = value
        self.values[SECTION_KEYS[self.kind][name]] = kept
