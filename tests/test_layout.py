"""The house rules that keep the code easy to move into (docs/architecture.md): no import cycles, the
contract imports nothing heavy, the operator never needs torch, modules stay small or say why."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOTS = {
    "ddp_operator": REPO / "operator" / "ddp_operator",
    "ddp_trainer": REPO / "trainer_image" / "ddp_trainer",
}
LONG = 300  # lines; a longer module says why in its docstring ("Long because ...")


def _modules() -> dict[str, Path]:
    found = {}
    for package, root in ROOTS.items():
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            found[name] = path
    return found


def _imports(name: str, path: Path, *, lazy: bool = True) -> set[str]:
    """Modules that ``name`` imports; ``lazy``: also those imported inside functions (a lazy import still
    closes a cycle, it only defers it), else module level only (what importing the module costs)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree) if lazy else tree.body:
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            out.add(base)
            out |= {f"{base}.{alias.name}" for alias in node.names}
    return out


MODULES = _modules()
GRAPH = {
    name: {m for m in _imports(name, path) if m in MODULES and m != name} for name, path in MODULES.items()
}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (module → modules it imports), or None."""
    done: set[str] = set()

    def visit(name: str, stack: list[str]) -> list[str] | None:
        if name in stack:
            return [*stack[stack.index(name) :], name]
        if name in done:
            return None
        for dep in sorted(graph.get(name, ())):
            # a module importing its own package's __init__ is fine
            if not name.startswith(dep + ".") and (cycle := visit(dep, [*stack, name])):
                return cycle
        done.add(name)
        return None

    for module in sorted(graph):
        if cycle := visit(module, []):
            return cycle
    return None


def test_no_import_cycles() -> None:
    assert GRAPH["ddp_operator.reconcile"] >= {"ddp_operator.observe", "ddp_trainer.contract"}
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " → ".join(cycle or [])


def test_the_cycle_check_can_fail() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"p.m": {"p"}, "p": set()}) is None


def test_the_contract_imports_only_the_standard_library() -> None:
    imported = {
        name.split(".")[0] for name in _imports("ddp_trainer.contract", MODULES["ddp_trainer.contract"])
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_the_operator_never_imports_torch_at_module_level() -> None:
    for name, path in MODULES.items():
        if name.startswith("ddp_operator"):
            heavy = {m for m in _imports(name, path, lazy=False) if m.split(".")[0] == "torch"}
            assert not heavy, f"{name} imports {heavy}: the operator image has no torch"
    trainer_side = {m for name in GRAPH if name.startswith("ddp_operator") for m in GRAPH[name]}
    assert {m for m in trainer_side if m.startswith("ddp_trainer")} <= {"ddp_trainer", "ddp_trainer.contract"}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_small_or_say_why(name: str) -> None:
    text = MODULES[name].read_text()
    lines = len(text.splitlines())
    reason = "Long because" in (ast.get_docstring(ast.parse(text)) or "")
    assert lines <= LONG or reason, f"{name} has {lines} lines: split it, or say why at its top"


EDGES = ("ddp_operator.local", "ddp_operator.cli", "ddp_operator.__main__")
"""The operator's edges: local mode and the command line (``__main__`` only calls it). They sit on the
core; the core (observe, decide, apply, render, ...) imports neither, so a cluster never runs local code."""


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """``<module> imports <edge>`` for each import from the operator's core into one of its edges."""
    core = [n for n in sorted(graph) if _under(n, "ddp_operator") and not any(_under(n, e) for e in EDGES)]
    return [
        f"{name} imports {dep}"
        for name in core
        for dep in sorted(graph[name])
        if any(_under(dep, edge) for edge in ("ddp_operator.local", "ddp_operator.cli"))
    ]


def test_the_core_never_imports_local_mode_or_the_cli() -> None:
    assert {"ddp_operator.local.run", "ddp_operator.cli", "ddp_operator.observe"} <= GRAPH.keys()
    assert layer_violations(GRAPH) == []


def test_the_layer_check_can_fail() -> None:
    graph = {
        "ddp_operator.observe": {"ddp_operator.local", "ddp_operator.local.logs", "ddp_trainer.contract"},
        "ddp_operator.spec": {"ddp_operator.cli"},
        "ddp_operator.local.run": {"ddp_operator.observe", "ddp_operator.local.gang"},
        "ddp_operator.cli": {"ddp_operator.local.run"},
        "ddp_operator.localish": {"ddp_operator.spec"},
    }
    assert layer_violations(graph) == [
        "ddp_operator.observe imports ddp_operator.local",
        "ddp_operator.observe imports ddp_operator.local.logs",
        "ddp_operator.spec imports ddp_operator.cli",
    ]
