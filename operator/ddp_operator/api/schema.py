"""Offline evaluation of a CRD's structural schema, as the Kubernetes API server does it.

Pure functions over plain data: defaulting (``apply_defaults``), OpenAPI v3 validation via jsonschema
(``to_json_schema`` converts Kubernetes' dialect), ``x-kubernetes-list-type: map`` key uniqueness, and the
``x-kubernetes-validations`` CEL rules via cel-python. ``validate`` returns every problem at once, each
naming the field path, the value and what would be accepted. Nothing here knows about DDPJob: the rules
come from the CRD itself, so there is no second copy of them.

Long because the API server's dialect (defaults, list maps, CEL with its field paths and messages) is one
concept; splitting it would scatter the same walk over the schema across files.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import celpy
import jsonschema
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

Schema = Mapping[str, Any]

# Human words for the patterns the CRD uses, so "must match ^(\+|-)?((..." reads as something actionable.
_QUANTITY_WORDS = "a Kubernetes quantity such as 1Gi, 512Mi, 500m or 8"
_PATTERN_WORDS = {
    "^/": "an absolute path (starting with /)",
    "^[a-z]([-a-z0-9]*[a-z0-9])?$": "a DNS-1035 label: lowercase letters, digits and '-', a letter first",
    "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$": "lowercase letters, digits, '-' and '.', alphanumeric at both ends",
    "^[-._a-zA-Z][-._a-zA-Z0-9]*$": "a variable name: letters, digits, '_', '-' and '.', no leading digit",
    "^([a-z][a-z0-9_]*|[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*)$": (
        "a built-in model name such as mlp, or a factory package.module:function"
    ),
}


@dataclass(frozen=True)
class Problem:
    """One reason an object is refused: the field's path, the offending value and what is accepted."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


def show(value: Any, limit: int = 80) -> str:
    """A value as the user wrote it (JSON), shortened for one line."""
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if "/" in key or "." in key:
        return f'{path}["{key}"]'
    return f"{path}.{key}" if path else key


# --- defaulting -------------------------------------------------------------------------------------


def apply_defaults(schema: Schema, value: Any) -> Any:
    """A copy of value with the schema's defaults filled in, top-down, as the API server does on write."""
    value = copy.deepcopy(value)
    _default_into(schema, value)
    return value


def _default_into(schema: Schema, value: Any) -> None:
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                _default_into(sub, value[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            for name, item in value.items():
                if name not in schema.get("properties", {}):
                    _default_into(extra, item)
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            _default_into(schema["items"], item)


# --- OpenAPI v3 (Kubernetes dialect) -> JSON Schema ---------------------------------------------------


def to_json_schema(schema: Schema, *, root: bool = True) -> dict[str, Any]:
    """Translate a structural schema into JSON Schema (draft 2020-12) for jsonschema.

    Objects without ``x-kubernetes-preserve-unknown-fields`` reject unknown fields, as ``kubectl apply``
    does with its default strict field validation. ``metadata`` at the root is the API server's to check,
    beyond what the CRD says of ``metadata.name``.
    """
    out: dict[str, Any] = {}
    for key in (
        "type",
        "enum",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "required",
        "format",
    ):
        if key in schema:
            out[key] = copy.deepcopy(schema[key])
    if schema.get("exclusiveMinimum") is True:
        out["exclusiveMinimum"] = out.pop("minimum")
    if schema.get("exclusiveMaximum") is True:
        out["exclusiveMaximum"] = out.pop("maximum")
    if schema.get("x-kubernetes-int-or-string"):
        pattern = out.pop("pattern", None)
        string: dict[str, Any] = {"type": "string", **({"pattern": pattern} if pattern else {})}
        return {"anyOf": [{"type": "integer"}, string]}
    if "properties" in schema:
        out["properties"] = {
            name: to_json_schema(sub, root=False) for name, sub in schema["properties"].items()
        }
        if root and "metadata" in out["properties"]:
            # The CRD may only constrain metadata.name; every other metadata field is the API server's.
            out["properties"]["metadata"].pop("additionalProperties", None)
    extra = schema.get("additionalProperties")
    if isinstance(extra, Mapping):
        out["additionalProperties"] = to_json_schema(extra, root=False)
    elif "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    if "items" in schema:
        out["items"] = to_json_schema(schema["items"], root=False)
    return out


# The schema errors after which the API server runs no CEL rule (its ``hasBlockingErr``: a wrong type, an
# unsupported enum value, a missing required field, too long, too many items or entries), for no rule
# could reason about such a value; it says so in a last line (NOT_CHECKED). After any other error (a
# bound, a pattern) the rules still run, and every problem is reported at once. An unknown field is
# refused before validation (strict decoding): no rule runs, and the server has no line for that.
_BLOCKING = {"type", "enum", "required", "maxLength", "maxItems", "maxProperties"}
NOT_CHECKED = (
    "some validation rules were not checked because the object was invalid; correct the existing errors "
    "to complete validation"
)
"""The API server's words (at no field) when a blocking error kept the CEL rules from running."""


def _blocks(error: jsonschema.ValidationError) -> bool:
    if str(error.validator) == "anyOf":  # int-or-string: a string off the pattern is a pattern error
        return isinstance(error.instance, bool) or not isinstance(error.instance, int | str)
    return str(error.validator) in _BLOCKING


def _schema_problems(schema: Schema, value: Any) -> tuple[list[Problem], str]:
    """Every schema problem, by path, and what keeps the CEL rules from running: "unknown" (a field),
    "blocking" (a blocking error) or nothing."""
    validator = jsonschema.Draft202012Validator(to_json_schema(schema))
    errors = list(validator.iter_errors(value))
    problems = [problem for error in errors for problem in _describe(error)]
    unknown = any(str(error.validator) == "additionalProperties" for error in errors)
    blocking = "unknown" if unknown else "blocking" if any(_blocks(error) for error in errors) else ""
    return sorted(problems, key=lambda problem: problem.path), blocking


def _path_of(error: jsonschema.ValidationError) -> str:
    path = ""
    for key in error.absolute_path:
        path = join(path, key)
    return path


def _describe(error: jsonschema.ValidationError) -> Iterator[Problem]:
    path, kind = _path_of(error), str(error.validator)
    value: Any = error.instance
    rule: Any = error.validator_value
    error_schema: Any = error.schema
    if kind == "required":
        missing = [name for name in rule if name not in value]
        for name in missing:
            yield Problem(join(path, name), "Required value: this field must be set")
    elif kind == "additionalProperties":
        known = sorted(error_schema.get("properties", {}))
        for name in sorted(set(value) - set(known)):
            yield Problem(join(path, name), f"unknown field (accepted here: {', '.join(known)})")
    elif kind == "type":
        yield Problem(path, f"Invalid value: {show(value)}: must be of type {rule}")
    elif kind == "enum":
        yield Problem(
            path, f"Unsupported value: {show(value)}: supported values: " + ", ".join(show(v) for v in rule)
        )
    elif kind == "anyOf":
        yield Problem(path, f"Invalid value: {show(value)}: must be {_QUANTITY_WORDS}")
    elif kind == "pattern":
        words = _QUANTITY_WORDS if "KMGTPE" in rule else _PATTERN_WORDS.get(rule, f"a match for {rule}")
        yield Problem(path, f"Invalid value: {show(value)}: must be {words}")
    else:
        bounds = {
            "minimum": f"must be ≥ {rule}",
            "maximum": f"must be ≤ {rule}",
            "exclusiveMinimum": f"must be > {rule}",
            "exclusiveMaximum": f"must be < {rule}",
            "minLength": f"must have at least {rule} characters",
            "maxLength": f"must have at most {rule} characters",
            "minItems": f"must have at least {rule} items",
            "maxItems": f"must have at most {rule} items",
            "minProperties": f"must have at least {rule} entries",
            "maxProperties": f"must have at most {rule} entries",
        }
        yield Problem(path, f"Invalid value: {show(value)}: {bounds.get(kind, error.message)}")


# --- list-type map keys ------------------------------------------------------------------------------


def _list_map_problems(schema: Schema, value: Any, path: str) -> Iterator[Problem]:
    for sub_schema, sub_value, sub_path in _walk(schema, value, path):
        keys = sub_schema.get("x-kubernetes-list-map-keys")
        if sub_schema.get("x-kubernetes-list-type") == "map" and keys and isinstance(sub_value, list):
            seen: set[str] = set()
            for index, item in enumerate(sub_value):
                if not isinstance(item, dict):
                    continue
                key = show({k: item.get(k) for k in keys})
                if key in seen:
                    yield Problem(
                        join(sub_path, index),
                        f"Duplicate value: {key}: each entry's {'/'.join(keys)} must be unique",
                    )
                seen.add(key)


def _walk(schema: Schema, value: Any, path: str) -> Iterator[tuple[Schema, Any, str]]:
    """Every (schema node, value, path) pair, parents before children."""
    yield schema, value, path
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for name, item in value.items():
            sub = properties.get(name, extra if isinstance(extra, Mapping) else None)
            if sub is not None:
                yield from _walk(sub, item, join(path, name))
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            yield from _walk(schema["items"], item, join(path, index))


# --- CEL rules ---------------------------------------------------------------------------------------

_CEL = celpy.Environment()
_CEL_LOCK = threading.Lock()  # cel-python's environment is not safe to share between threads


@dataclass(frozen=True)
class _Rule:
    rule: str
    message: str | None
    message_expression: str | None
    field_path: str


def _rules(schema: Schema) -> list[_Rule]:
    """The rules a new object must pass. Transition rules (those reading ``oldSelf``) judge an update
    against the stored object: the API server runs them; an offline check of one document has no old one."""
    return [
        _Rule(r["rule"], r.get("message"), r.get("messageExpression"), r.get("fieldPath", ""))
        for r in schema.get("x-kubernetes-validations", [])
        if not _OLD_SELF.search(r["rule"])
    ]


_OLD_SELF = re.compile(r"\boldSelf\b")


@functools.cache
def _program(expression: str) -> Any:
    """Each rule is parsed once per process (lark parsing costs more than evaluating)."""
    return _CEL.program(_CEL.compile(expression))


def _evaluate(expression: str, self_value: Any) -> Any:
    with _CEL_LOCK:
        return _program(expression).evaluate({"self": json_to_cel(self_value)})


_FIELD_STEP = re.compile(r"\.([^.\[]+)|\['([^']*)'\]")


def field_keys(field_path: str) -> list[str]:
    """The keys of a rule's fieldPath: ".a.b['c/d']" → ["a", "b", "c/d"]."""
    return [dotted or quoted for dotted, quoted in _FIELD_STEP.findall(field_path)]


def _lookup(value: Any, keys: list[str]) -> tuple[bool, Any]:
    """The value at a rule's fieldPath, if there is one."""
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return False, None
        value = value[key]
    return True, value


def _cel_problems(schema: Schema, value: Any, path: str) -> Iterator[Problem]:
    for sub_schema, sub_value, sub_path in _walk(schema, value, path):
        for rule in _rules(sub_schema):
            try:
                passed = bool(_evaluate(rule.rule, sub_value))
            except (CELEvalError, TypeError, ValueError, KeyError) as exc:
                yield Problem(sub_path, f"rule {rule.rule!r} could not be evaluated: {exc}")
                continue
            if passed:
                continue
            message = rule.message or f"failed rule: {rule.rule}"
            if rule.message_expression:
                with contextlib.suppress(CELEvalError, TypeError, ValueError, KeyError):
                    message = str(_evaluate(rule.message_expression, sub_value))
            keys = field_keys(rule.field_path)
            field = sub_path
            for key in keys:
                field = join(field, key)
            found, at = _lookup(sub_value, keys)
            shown = f"Invalid value: {show(at)}: " if found and not isinstance(at, dict | list) else ""
            yield Problem(field, shown + " ".join(message.split()))


# --- the whole verdict ---------------------------------------------------------------------------------


def validate(schema: Schema, value: Any) -> list[Problem]:
    """Every problem with an already-defaulted value, as the API server reports them: the schema's, then
    the CEL rules' — unless a schema problem blocks them (a value of the wrong shape, which no rule should
    reason about): then, as the server does, a last line says the rules were not checked."""
    problems, blocked = _schema_problems(schema, value)
    problems += _list_map_problems(schema, value, "")
    if blocked == "blocking":
        problems.append(Problem("", NOT_CHECKED))
    elif not blocked:
        problems += _cel_problems(schema, value, "")
    return problems
