"""The structural-schema engine behind `ddpjob validate`, on small schemas of its own."""

from __future__ import annotations

from typing import Any

from ddp_operator.api import schema

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "x-kubernetes-validations": [
                {
                    "rule": "self.low <= self.high",
                    "fieldPath": ".high",
                    "messageExpression": "'high ' + string(self.high) + ' is below low ' + string(self.low)",
                },
                {"rule": "self.low != 13", "message": "unlucky", "messageExpression": "self.nope + 'x'"},
            ],
            "properties": {
                "low": {"type": "integer", "default": 1},
                "high": {"type": "integer", "default": 10},
                "rate": {"type": "number", "minimum": 0, "exclusiveMinimum": True},
                "size": {"x-kubernetes-int-or-string": True, "pattern": "^[0-9]+Gi$"},
                "nested": {
                    "type": "object",
                    "default": {},
                    "properties": {"flag": {"type": "boolean", "default": True}},
                },
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
        },
    },
}


def test_defaults_fill_top_down_without_overwriting() -> None:
    original = {"spec": {"high": 5}}
    out = schema.apply_defaults(SCHEMA, original)
    assert out == {"spec": {"low": 1, "high": 5, "nested": {"flag": True}}}
    assert original == {"spec": {"high": 5}}


def test_valid_value_has_no_problems() -> None:
    value = schema.apply_defaults(SCHEMA, {"spec": {"rate": 0.5, "size": "4Gi", "free": {"anything": [1]}}})
    assert schema.validate(SCHEMA, value) == []


def test_int_or_string_and_exclusive_minimum() -> None:
    assert schema.validate(SCHEMA, schema.apply_defaults(SCHEMA, {"spec": {"size": 4}})) == []
    problems = schema.validate(SCHEMA, schema.apply_defaults(SCHEMA, {"spec": {"size": "4GB", "rate": 0}}))
    assert [p.path for p in problems] == ["spec.rate", "spec.size"]
    assert "must be > 0" in problems[0].message


def test_unknown_fields_refused_except_where_preserved() -> None:
    problems = schema.validate(SCHEMA, schema.apply_defaults(SCHEMA, {"spec": {"nested": {"x": 1}}}))
    assert [str(p) for p in problems] == ["spec.nested.x: unknown field (accepted here: flag)"]


def test_cel_rule_with_field_path_and_message_expression() -> None:
    problems = schema.validate(SCHEMA, schema.apply_defaults(SCHEMA, {"spec": {"low": 7, "high": 3}}))
    assert [str(p) for p in problems] == ["spec.high: Invalid value: 3: high 3 is below low 7"]


def test_broken_message_expression_falls_back_to_message() -> None:
    problems = schema.validate(SCHEMA, schema.apply_defaults(SCHEMA, {"spec": {"low": 13, "high": 20}}))
    assert [str(p) for p in problems] == ["spec: unlucky"]


def test_cel_waits_for_a_well_shaped_value() -> None:
    """As the API server: a value of the wrong type blocks the rules, and a last line says so."""
    problems = schema.validate(SCHEMA, schema.apply_defaults(SCHEMA, {"spec": {"low": "7", "high": 3}}))
    assert [p.path for p in problems] == ["spec.low", ""]
    assert problems[-1].message == schema.NOT_CHECKED


def test_cel_runs_after_a_bound_or_pattern_problem() -> None:
    """A value off its bounds or pattern is well shaped: the rules run too, and both problems show."""
    doc = {"spec": {"low": 7, "high": 3, "size": "4GB"}}
    problems = schema.validate(SCHEMA, schema.apply_defaults(SCHEMA, doc))
    assert [p.path for p in problems] == ["spec.size", "spec.high"]


def test_show_shortens() -> None:
    long = schema.show("x" * 200)
    assert len(long) == 80 and long.endswith("...")
    assert schema.show({"a": 1}) == '{"a": 1}'
