"""No raw status key outside the builder (issue 56 item 1): the modules that decide a DDPJob's status read it
typed (``api/typed_status.py``: ``last.restarts_in_place``, ``status.condition("Ready")``) and write it
through the one builder (``decide/status_builder.py``: ``out.set(ready_nodes=2)``), never as
``values["readyNodes"]``, ``previous.get("phase")`` or ``{"kind": ...}``.

A raw key is a string that names a property of the CRD's status schema (at any depth), used as a mapping's
key: a subscript, the first argument of ``get``/``pop``/``setdefault``, a dict literal's key, the left of
``in``, a keyword of ``update``. The names the trainer reports (``contract.Report`` and the dicts it holds)
are left out: they are the report's keys, typed by ``contract`` and read from the report, and some are
also the status's (``message``, ``reason``, ``attempt``); but for ``restartsInPlace`` and ``lastRestart``,
which the report's constants name (``contract.REPORT_RESTARTS_IN_PLACE``). Checked: every module of
``decide/`` but the builder's. ``api/`` and the rest of the operator read other objects (schema nodes,
pods, Jobs, Workloads, Nodes: their ``type``, ``status``, ``phase``, ``conditions``), where a bare string
says nothing; ``api/typed_status.py`` spells no key (each comes from the CRD by its field's name).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from ddp_operator.api import typed_status
from ddp_trainer import contract

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "ddp_operator"
CHECKED = ("decide",)
BUILDER = {
    "decide/status_builder.py": "the one builder: it writes the mapping (the conditions' keys, the "
    "status's own key in the DDPJob)",
}
NOT_YET: dict[str, str] = {}
"""Modules that still spell status keys, each with why (none now)."""


def _properties(node: Mapping[str, Any]) -> Iterator[str]:
    for key, sub in (node.get("properties") or {}).items():
        yield key
        yield from _properties(sub)
    if isinstance(node.get("items"), Mapping):
        yield from _properties(node["items"])


REPORTED = (
    set(contract.Report.__annotations__)
    | set(contract.Failure.__annotations__)
    | set(contract.EarlierWorlds.__annotations__)
) - {contract.REPORT_RESTARTS_IN_PLACE, contract.REPORT_LAST_RESTART}  # read through these constants
KEYS = set(_properties(typed_status.schema())) - REPORTED


def raw_keys(source: str) -> list[tuple[int, str]]:
    """(line, key) of each raw status key in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        used: list[ast.expr] = []
        if isinstance(node, ast.Subscript):
            used = [node.slice]
        elif isinstance(node, ast.Dict):
            used = [key for key in node.keys if key is not None]
        elif isinstance(node, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops):
            used = [node.left]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("get", "pop", "setdefault") and node.args:
                used = [node.args[0]]
            elif node.func.attr == "update":
                found += [(node.lineno, k.arg) for k in node.keywords if k.arg in KEYS]
        found += [(u.lineno, u.value) for u in used if isinstance(u, ast.Constant) and u.value in KEYS]
    return sorted(found)


MODULES = sorted(
    str(path.relative_to(PACKAGE))
    for folder in CHECKED
    for path in (PACKAGE / folder).rglob("*.py")
    if str(path.relative_to(PACKAGE)) not in BUILDER
)


@pytest.mark.parametrize("module", MODULES)
def test_no_raw_status_key_outside_the_builder(module: str) -> None:
    found = raw_keys((PACKAGE / module).read_text())
    if module in NOT_YET:
        assert found, f"{module} spells no status key any more: take it off NOT_YET ({NOT_YET[module]})"
        return
    assert found == [], (
        f"{module} spells status keys {found}: read the status typed (ddp_operator.api.typed_status) and "
        "write it through decide/status_builder.StatusBuilder"
    )


def test_the_check_finds_every_kind_of_raw_key() -> None:
    source = """
previous.get("phase")
values["readyNodes"] = 1
out = {"kind": "InPlace", "message": "m"}
"lastRestart" in previous
values.update(observedGeneration=1)
values.pop("kueue", None)
report.get("message")
out.set(ready_nodes=1)
"""
    assert raw_keys(source) == [
        (2, "phase"),
        (3, "readyNodes"),
        (4, "kind"),
        (5, "lastRestart"),
        (6, "observedGeneration"),
        (7, "kueue"),
    ]


def test_the_builder_modules_exist() -> None:
    assert [m for m in (*BUILDER, *NOT_YET) if not (PACKAGE / m).is_file()] == []
