"""The module tables in docs/architecture.md are the tree's own (issue 56 item 7: docs that cannot drift).

Each folder of ``ddp_operator`` and ``ddp_trainer`` has a table under a heading that names it
(``#### `ddp_operator/api/`: ...``, ``## Local mode: `ddp_operator.local```, ``(top level)`` for the
package itself), whose first column names each module in backticks. A module added to a folder without its
row fails here, naming it, and so does a row left behind by a module moved or removed. A subpackage without
a table of its own (``sync/fingerprints/``, ``integrations/``) is one row, ``name/``, in its parent's table,
which names each of its modules in backticks; a file that is no module (the CRD, the hook's
``sitecustomize.py``) is a row by its path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARCHITECTURE = REPO / "docs" / "architecture.md"
ROOTS = {
    "ddp_operator": REPO / "operator" / "ddp_operator",
    "ddp_trainer": REPO / "trainer_image" / "ddp_trainer",
}
FOLDER = re.compile(r"`(ddp_operator|ddp_trainer)((?:[./][a-z_]+)*)/?`")
TICKED = re.compile(r"`([^`]+)`")


def _tables() -> dict[str, list[tuple[str, str]]]:
    """Per folder (``ddp_trainer/sync``), its table's rows: (first cell, whole row), from architecture.md."""
    tables: dict[str, list[tuple[str, str]]] = {}
    folder: str | None = None
    for line in ARCHITECTURE.read_text().splitlines():
        if line.startswith("#"):
            named = FOLDER.search(line)
            folder = named[1] + named[2].replace(".", "/") if named else None
            continue
        if folder is None or not line.startswith("|") or line.startswith("|---"):
            continue
        first = line.strip("|").split("|")[0].strip()
        if first != "module":
            tables.setdefault(folder, []).append((first, line))
    return tables


TABLES = _tables()


def _package(folder: str) -> Path:
    root, _, rest = folder.partition("/")
    return ROOTS[root] / rest


def _subpackages(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if (p / "__init__.py").is_file())


def _modules(path: Path) -> list[str]:
    return sorted(p.stem for p in path.glob("*.py") if p.name != "__init__.py")


def test_every_folder_of_both_packages_has_a_table() -> None:
    """A folder is a table of its own, or a ``name/`` row of its parent's table."""
    rows = {
        folder: {name for first, _ in found for name in TICKED.findall(first)}
        for folder, found in TABLES.items()
    }
    missing = []
    for root, path in ROOTS.items():
        for package in [path, *(p.parent for p in path.rglob("__init__.py") if p.parent != path)]:
            folder = f"{root}/{package.relative_to(path)}".removesuffix("/.")
            parent = folder.rsplit("/", 1)[0]
            if folder not in TABLES and not any(
                name.startswith(package.name + "/") for name in rows.get(parent, ())
            ):
                missing.append(folder)
    assert not missing, f"folders without a table in docs/architecture.md: {missing}"


@pytest.mark.parametrize("folder", sorted(TABLES))
def test_a_folders_table_names_its_modules_and_only_them(folder: str) -> None:
    path = _package(folder)
    assert path.is_dir(), f"docs/architecture.md has a table for {folder}, which is no folder"
    named: set[str] = set()
    stale = []
    for first, row in TABLES[folder]:
        for name in TICKED.findall(first):
            named.add(name.split("/")[0] + "/" if "/" in name else name)
            if name.endswith("/"):  # a subpackage: its row names each of its modules
                sub = path / name.rstrip("/")
                unnamed = [m for m in _modules(sub) if f"`{m}`" not in row and f"`{m}.py`" not in row]
                assert not unnamed, f"{folder}'s row `{name}` does not name {unnamed}"
            target = path / name.rstrip("/")
            if not (target.with_suffix(".py").is_file() or target.is_dir() or target.is_file()):
                stale.append(name)
    assert not stale, f"docs/architecture.md's table of {folder} names what is not in it: {stale}"
    tabled = {s.name for s in _subpackages(path) if f"{folder}/{s.name}" in TABLES}
    expected = set(_modules(path)) | {f"{s.name}/" for s in _subpackages(path) if s.name not in tabled}
    assert not expected - named, f"docs/architecture.md's table of {folder} lacks {sorted(expected - named)}"
