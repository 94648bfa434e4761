"""The CRD is one file, complete enough for `kubectl explain`, with rules the API server will accept."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import celpy
import pytest
import yaml

from ddp_operator import cli
from ddp_operator.api import crd, schema
from helpers import REPO


def _nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}.*")
    if "items" in schema:
        yield from _nodes(schema["items"], f"{path}[]")


def test_chart_and_manifest_are_generated_from_the_package_file() -> None:
    chart = REPO / "charts" / "ddpjob-operator" / "crds" / crd.CRD_FILE
    assert chart.read_text() == crd.chart_crd_text(), f"{chart} is stale: run `make manifests`"
    assert (REPO / "manifests" / "crd.yaml").read_text() == crd.manifest_text(), (
        "manifests/crd.yaml is stale: run `make manifests`"
    )
    assert yaml.safe_load(chart.read_text()) == crd.crd()


def test_ddpjob_crd_prints_the_package_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["crd"]) == 0
    packaged = REPO / "operator" / "ddp_operator" / "api" / "crds" / crd.CRD_FILE
    assert capsys.readouterr().out == packaged.read_text()


def test_names_columns_and_subresources() -> None:
    spec = crd.crd()["spec"]
    assert spec["names"]["shortNames"] == ["ddpj"]
    assert "ddpjob" in spec["names"]["categories"]
    (version,) = spec["versions"]
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.nodes",
            "statusReplicasPath": ".status.readyNodes",
            "labelSelectorPath": ".status.selector",
        },
    }
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Phase",
        "Reason",
        "Nodes",
        "Elastic",
        "Attempt",
        "Sync",
        "Progress",
        "ETA",
        "Age",
        "Message",
    ]


def test_every_spec_and_status_field_is_described() -> None:
    schema = crd.openapi_schema()
    undocumented = [
        path
        for path, node in _nodes(schema)
        if path.startswith((".spec", ".status"))
        and not path.endswith((".*", "[]"))
        and not node.get("description")
    ]
    assert undocumented == []


def test_every_rule_compiles_and_every_field_path_exists() -> None:
    env = celpy.Environment()
    seen = 0
    for path, node in _nodes(crd.openapi_schema()):
        for rule in node.get("x-kubernetes-validations", []):
            seen += 1
            env.compile(rule["rule"])
            if "messageExpression" in rule:
                env.compile(rule["messageExpression"])
            assert "message" in rule or "messageExpression" in rule, f"{path}: rule without a message"
            target = node
            for key in schema.field_keys(rule.get("fieldPath", "")):
                known = target.get("properties", {})
                assert key in known or isinstance(target.get("additionalProperties"), dict), (
                    f"{path}: fieldPath {rule['fieldPath']} is not a field"
                )
                target = known.get(key) or target["additionalProperties"]
    assert seen >= 10


def test_defaults_match_the_design() -> None:
    props = crd.openapi_schema()["properties"]["spec"]["properties"]
    assert props["procsPerNode"]["default"] == 1
    assert props["device"]["default"] == "cuda"
    assert props["masterPort"]["default"] == 29500
    assert props["metricsPort"]["default"] == 9400
    assert props["maxRestarts"]["default"] == 3
    assert props["syncCheck"]["properties"]["everySteps"]["default"] == 100
    assert props["syncCheck"]["properties"]["onDivergence"]["default"] == "Fail"


SCHEMA_KEYWORDS = {
    *("type", "description", "properties", "items", "default", "enum", "format", "required", "nullable"),
    *("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "pattern", "title"),
    *("minLength", "maxLength", "minItems", "maxItems", "uniqueItems", "minProperties", "maxProperties"),
    *("additionalProperties", "anyOf", "oneOf", "allOf", "not", "example"),
    *("x-kubernetes-validations", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-list-type"),
    *("x-kubernetes-list-map-keys", "x-kubernetes-int-or-string", "x-kubernetes-embedded-resource"),
    "x-kubernetes-map-type",
}


def test_every_schema_node_has_only_schema_keywords() -> None:
    """A YAML flow mapping with an unquoted comma in its description (``{description: a, b}``) makes ``b`` a
    key: the API server refuses the whole CRD (``field not declared in schema``); say which node here."""
    stray = [
        (path, sorted(set(node) - SCHEMA_KEYWORDS))
        for path, node in _nodes(crd.openapi_schema())
        if set(node) - SCHEMA_KEYWORDS
    ]
    assert stray == []
