"""A CRD object → a dataclass's fields, read by name (``warmup_steps`` ← ``warmupSteps``): each field from
its CRD property, converted by its type, a nested dataclass read the same way with its schema's defaults.
Pure; :mod:`.spec` reads the DDPJob's spec through it, :mod:`.typed_status` names the status the same way.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from collections.abc import Mapping as AbcMapping
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, Union

from ddp_operator.api import schema


def crd_key(f: Any) -> str | None:
    """The CRD property (a dotted path under its object) a dataclass field is read from: its camelCase
    name, unless the field says otherwise (``metadata={"key": ...}``; None: not read from the spec)."""
    if "key" in f.metadata:
        key: str | None = f.metadata["key"]
        return key
    head, *rest = str(f.name).split("_")
    return head + "".join(word.capitalize() for word in rest)


def _lookup(mapping: Mapping[str, Any], path: str) -> Any:
    for part in path.split("."):
        if not isinstance(mapping, AbcMapping) or part not in mapping:
            return MISSING
        mapping = mapping[part]
    return mapping


def _nested(kind: Any) -> tuple[Any, bool]:
    """The dataclass a field holds (or None), and whether the field may be None."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return (inner[0] if len(inner) == 1 and is_dataclass(inner[0]) else None), True
    return (kind if is_dataclass(kind) else None), False


def _convert(kind: Any, value: Any) -> Any:
    origin = typing.get_origin(kind)
    if origin in (Union, types.UnionType):
        kinds = [a for a in typing.get_args(kind) if a is not type(None)]
        return value if value is None or len(kinds) != 1 else _convert(kinds[0], value)
    if origin is tuple:
        return tuple(value)
    if origin in (Mapping, AbcMapping, dict):
        return {k: dict(v) if isinstance(v, AbcMapping) else v for k, v in value.items()}
    if kind is float:
        return float(value)
    return value


def from_crd(cls: Any, mapping: Mapping[str, Any], node: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of dataclass ``cls`` read from ``mapping``, a CRD object whose schema is ``node``: each
    field from its :func:`crd_key`, converted by its type (tuples, mappings, floats), a nested dataclass
    read the same way (an absent object takes its schema's defaults, or None where the field may be None).
    Absent fields keep the dataclass's default (else empty, or None: :func:`_empty`). The CRD's schema is
    the one source; tests/unit/operator/api/test_spec.py proves every property has a field and every field a
    property. A value of the wrong shape where an object belongs is a ``TypeError`` naming it."""
    if not isinstance(mapping, AbcMapping):
        raise TypeError(f"expected an object for {cls.__name__}, got {type(mapping).__name__}")
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in fields(cls):
        key = crd_key(f)
        if key is None:
            continue
        kind = hints[f.name]
        sub, optional = _nested(kind)
        value = _lookup(mapping, key)
        if sub is not None:
            sub_node = _node(node, key)
            if value is MISSING and optional:
                out[f.name] = None
                continue
            if value is MISSING:
                value = schema.apply_defaults(sub_node, {})
            out[f.name] = sub(**from_crd(sub, value, sub_node))
        elif value is not MISSING:
            out[f.name] = _convert(kind, value)
        elif f.default is MISSING and f.default_factory is MISSING:
            out[f.name] = _empty(kind)
    return out


def _empty(kind: Any) -> Any:
    """An absent list is an empty tuple, an absent object an empty mapping, anything else None."""
    origin = typing.get_origin(kind)
    return () if origin is tuple else {} if origin in (Mapping, AbcMapping, dict) else None


def _node(node: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    for part in path.split("."):
        node = node["properties"][part]
    return node
