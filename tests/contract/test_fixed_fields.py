"""A spec field cannot be half-added: the fields that cannot change after creation are declared once
(``contract.RECORDED_SETTINGS``, ``contract.CHECKPOINT_PLACE_FIELDS``) and every list that must agree with
them is compared here — the CRD's CEL transition rules (``oldSelf``), the settings a checkpoint records
(``provenance.settings_of``), the table in docs/operator.md, and the trainer flags the operator renders.
A training-shaping field without its CEL rule would be accepted by kubectl and then refused at resume
(SettingsChanged); each test names the field that is missing where."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_operator.api import crd, spec
from ddp_operator.children import container
from ddp_trainer import contract
from ddp_trainer.checkpoint import provenance
from ddp_trainer.core.config import TrainerConfig

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "quickstart.yaml"


def fixed_by_rules(schema: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[str]:
    """Every field path (under ``spec``) that a transition rule (one reading ``oldSelf``) pins."""
    for rule in schema.get("x-kubernetes-validations", ()):
        for name in re.findall(r"oldSelf\.([A-Za-z0-9_.]+)", rule["rule"]):
            yield ".".join((*path, name))
    for name, child in schema.get("properties", {}).items():
        yield from fixed_by_rules(child, (*path, name))


def crd_fixed() -> set[str]:
    (version,) = yaml.safe_load(crd.crd_text())["spec"]["versions"]
    return set(fixed_by_rules(version["schema"]["openAPIV3Schema"]["properties"]["spec"]))


def doc_rows() -> dict[str, str]:
    """docs/operator.md's table of fixed fields: ``path under spec`` → the recorded setting ("" if —)."""
    text = (REPO / "docs" / "operator.md").read_text()
    section = text.split("## Spec changes after the job started", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `spec\.([^`]+)` \| (?:`([a-z_]+)`|—) \|", section, flags=re.MULTILINE)
    return dict(rows)


def differences(name: str, have: set[str], declared: set[str]) -> str:
    return (
        f"{name}: missing {sorted(declared - have)}, not declared in the contract {sorted(have - declared)}"
    )


def test_the_crd_fixes_exactly_the_declared_fields() -> None:
    have, declared = crd_fixed(), set(contract.FIXED_SPEC_FIELDS)
    assert have == declared, differences("the CRD's oldSelf rules", have, declared)


def test_checkpoints_record_exactly_the_declared_settings() -> None:
    have = set(provenance.settings_of(TrainerConfig(), 2, precision="fp32", optimizer="AdamW"))
    declared = set(contract.RECORDED_SETTINGS)
    assert have == declared, differences("provenance.settings_of", have, declared)


def test_the_docs_list_exactly_the_declared_fields() -> None:
    rows = doc_rows()
    declared = {path: setting for setting, paths in contract.RECORDED_SETTINGS.items() for path in paths}
    declared |= dict.fromkeys(contract.CHECKPOINT_PLACE_FIELDS, "")
    assert set(rows) == set(declared), differences("docs/operator.md's table", set(rows), set(declared))
    assert rows == declared  # and each with the setting it is recorded as


def test_every_rendered_trainer_flag_is_recorded_or_declared_changeable() -> None:
    """A new spec field rendered as a trainer flag must say which: recorded (and then fixed) or free."""
    values = container.trainer_values(spec.parse(yaml.safe_load(EXAMPLE.read_text())))
    recorded = {contract.RECORDED_FROM_FLAG.get(flag, flag) for flag in values} - set(
        contract.CHANGEABLE_TRAINER_SETTINGS
    )
    assert recorded <= set(contract.RECORDED_SETTINGS), (
        f"trainer flags {sorted(recorded - set(contract.RECORDED_SETTINGS))} are neither recorded in "
        "checkpoints (contract.RECORDED_SETTINGS) nor declared changeable (CHANGEABLE_TRAINER_SETTINGS)"
    )
    assert not contract.CHANGEABLE_TRAINER_SETTINGS & set(contract.RECORDED_SETTINGS)


def test_the_rules_are_read_from_every_level_of_the_schema() -> None:
    """The parser of this file sees a rule at any depth, so a missing one cannot hide from it."""
    schema = {
        "x-kubernetes-validations": [{"rule": "self.a == oldSelf.a"}],
        "properties": {"t": {"x-kubernetes-validations": [{"rule": "self.b == oldSelf.b && x == y"}]}},
    }
    assert set(fixed_by_rules(schema)) == {"a", "t.b"}


@pytest.mark.parametrize(
    ("field", "pinned"),
    [
        ("trainer.seed", "oldSelf.trainer.seed"),
        ("nodes", "oldSelf.nodes"),
        ("checkpoint.mountPath", "oldSelf.mountPath"),
    ],
)
def test_a_field_without_its_rule_fails_naming_it(
    field: str, pinned: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = crd.crd_text()
    cut = re.sub(rf"{re.escape(pinned)}\b", "oldSelf.unrelated", text)  # the rule no longer pins the field
    assert cut != text
    monkeypatch.setattr(crd, "crd_text", lambda: cut)
    with pytest.raises(AssertionError, match=re.escape(f"missing ['{field}']")):
        test_the_crd_fixes_exactly_the_declared_fields()
