"""The house rules that keep the code easy to move into (docs/architecture.md). The layers are folders and
import-linter checks them in `make lint` ([tool.importlinter] in pyproject.toml); here: that checker can
fail, the contract imports nothing but the standard library, modules stay small or say why."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
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


def test_the_contract_imports_only_the_standard_library() -> None:
    """Each module of the contract package imports the standard library and its own modules, nothing else."""
    parts = [
        name for name in MODULES if name == "ddp_trainer.contract" or name.startswith("ddp_trainer.contract.")
    ]
    assert len(parts) > 1, parts
    imported = {
        name
        for part in parts
        for name in _imports(part, MODULES[part])
        if name != "ddp_trainer.contract" and not name.startswith("ddp_trainer.contract.")
    }
    assert {name.split(".")[0] for name in imported} <= set(sys.stdlib_module_names) | {"__future__"}, (
        imported
    )


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_small_or_say_why(name: str) -> None:
    text = MODULES[name].read_text()
    lines = len(text.splitlines())
    reason = "Long because" in (ast.get_docstring(ast.parse(text)) or "")
    assert lines <= LONG or reason, f"{name} has {lines} lines: split it, or say why at its top"


def test_every_layer_is_a_folder_the_layer_contract_names() -> None:
    """A new folder of either package joins a layer of its contract, or lint-imports would not see it."""
    config = (REPO / "pyproject.toml").read_text()
    for package, root in ROOTS.items():
        for folder in sorted(p for p in root.iterdir() if (p / "__init__.py").is_file()):
            name = f"{package}.{folder.name}"
            assert f'"{name}' in config or f"| {name}" in config, f"{name} is in no import-linter layer"


def test_lint_imports_fails_on_an_import_against_the_layers(tmp_path: Path) -> None:
    """The checker `make lint` runs, on a two-layer package whose lower layer imports the upper one."""
    pkg = tmp_path / "house"
    for layer, body in (("upper", ""), ("lower", "from house import upper\n")):
        (pkg / layer).mkdir(parents=True)
        (pkg / layer / "__init__.py").write_text(body)
    (pkg / "__init__.py").write_text("")
    (tmp_path / ".importlinter").write_text(
        textwrap.dedent(
            """\
            [importlinter]
            root_package = house

            [importlinter:contract:layers]
            name = house layers
            type = layers
            layers =
                house.upper
                house.lower
            """
        )
    )
    lint = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run([str(lint), "--no-cache"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "house.lower is not allowed to import house.upper" in run.stdout


def _documented_modules(text: str) -> dict[str, set[str]]:
    """The modules docs/architecture.md's tables name, by the folder whose heading they sit under (a
    heading's first backticked name: `ddp_operator/api/`, `ddp_operator.local`, `ddp_trainer/`). A row's
    first cell names modules (`model`, `data`, `bootstrap/sitecustomize.py`); a row whose first cell is a
    folder (`fingerprints/`) names that folder's modules anywhere in the row."""
    sections: dict[str, set[str]] = {}
    folder = None
    for line in text.splitlines():
        if line.startswith("#"):
            tokens = re.findall(r"`([^`]+)`", line)
            first = tokens[0].replace(".", "/").rstrip("/") if tokens else ""
            folder = first if first.split("/")[0] in ROOTS else None
            continue
        if folder is None or not line.startswith("|"):
            continue
        names = sections.setdefault(folder, set())
        for head in re.findall(r"`([^`]+)`", line.strip("|").split("|")[0]):
            if head.endswith("/"):
                names |= {head + token for token in re.findall(r"`([^`]+)`", line) if token != head}
            names.add(head.removesuffix(".py").rstrip("/"))
    return sections


def test_the_architecture_tables_name_every_module() -> None:
    """Each module has a row in docs/architecture.md, in the table of its folder (or of the nearest folder
    above it that has one), so that the tables say where everything lives."""
    sections = _documented_modules((REPO / "docs" / "architecture.md").read_text())
    missing = []
    for package, root in ROOTS.items():
        for path in sorted(root.rglob("*.py")):
            if path.name == "__init__.py":
                continue
            parts = (package, *path.relative_to(root).with_suffix("").parts)
            homes = [i for i in range(len(parts) - 1, 0, -1) if "/".join(parts[:i]) in sections]
            home = homes[0] if homes else 1
            if "/".join(parts[home:]) not in sections.get("/".join(parts[:home]), set()):
                missing.append(f"{'/'.join(parts)} (in the table of {'/'.join(parts[:home])}/)")
    assert not missing, "docs/architecture.md has no row for: " + ", ".join(missing)


TEST_ROOTS = (REPO / "tests", REPO / "testcluster" / "tests")
TEST_FILES = sorted(p for root in TEST_ROOTS for p in root.rglob("test_*.py") if "public" not in p.parts)


def test_no_two_test_files_share_a_name() -> None:
    """Test modules import by their file name (no packages in the test folders): two of one name would
    shadow each other, and a reader could not say which one a report means."""
    seen: dict[str, list[str]] = {}
    for path in TEST_FILES:
        seen.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_the_tiers_are_folders_and_unit_tests_mirror_the_packages() -> None:
    tiers = {p.name for p in (REPO / "tests").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert tiers == {"unit", "integration", "e2e", "contract", "helpers", "public"}, tiers
    for package, root in ROOTS.items():
        half = REPO / "tests" / "unit" / package.removeprefix("ddp_")
        for folder in (
            p for p in half.rglob("*") if p.is_dir() and p.name not in ("__pycache__", "golden", "refused")
        ):
            assert (root / folder.relative_to(half) / "__init__.py").exists(), (
                f"{folder} mirrors no {package} package"
            )
    # the benchmarks' shared helpers (bench/paired.py) are tested too: tests/unit/bench mirrors bench/,
    # a test module per module it tests (bench/ is scripts on sys.path, no package)
    unit = REPO / "tests" / "unit"
    halves = {p.name for p in unit.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert halves <= {"operator", "trainer", "bench"}, halves
    for path in (unit / "bench").rglob("test_*.py"):
        tested = REPO / "bench" / path.relative_to(unit / "bench").with_name(path.name.removeprefix("test_"))
        assert tested.is_file(), f"{path} mirrors no module of bench/ ({tested} is missing)"


def test_helpers_hold_no_tests_and_tests_import_no_tests() -> None:
    helpers = REPO / "tests" / "helpers"
    for path in helpers.rglob("*.py"):
        defined = [n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)]
        assert not [name for name in defined if name.startswith("test_")], path
    for path in TEST_FILES:
        imported = {
            (node.module or "").rpartition(".")[2]
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom)
        }
        assert not {name for name in imported if name.startswith("test_")}, (
            f"{path} imports another test module"
        )
