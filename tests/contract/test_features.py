"""Each feature's figures in docs/architecture.md are the tree's own: the table under "Each feature's home"
records what ``hack/features.py -q`` counts for the code as it is (issue 56: each of six features at home in
at most 8 files, none entered twice, and a script that counts them so the figure can be checked again): each
feature's files, how many of them are the common ground (the modules at least half of the features enter),
its home (the rest) and the modules entered twice; and the common ground itself, named. The script follows
each feature's entrances in a process of its own (it forms a one-process gloo group, which must not leak
into other tests), in about ten seconds."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEADING = "### Each feature's home"
FIGURES = re.compile(r"([a-z-]+): files (\d+), common ground (\d+), home (\d+), entered twice (\d+)")
COMMON = re.compile(r"common ground: (.*)")
COLUMNS = "| feature | files | common ground | home | entered twice |"
FEATURES = (
    "elastic-resize",
    "fingerprint-check",
    "restart-in-place",
    "compute-probe",
    "kueue-reason",
    "checkpoint-identity",
)
GOAL_FILES = 8


Figures = tuple[int, int, int, int]
"""A feature's files, common ground, home and entered twice."""


def _section(text: str) -> str:
    return text.split(HEADING, 1)[1].split("\n#", 1)[0]


def _rows(text: str) -> dict[str, Figures]:
    """The rows of the features' table: feature → (files, common ground, home, entered twice)."""
    rows = {}
    for line in _section(text).splitlines():
        cells = [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 5 and all(cell.isdigit() for cell in cells[1:]):
            rows[cells[0]] = (int(cells[1]), int(cells[2]), int(cells[3]), int(cells[4]))
    return rows


def _common(text: str) -> list[str]:
    """The common ground the section names: the modules of its line ``Common ground: `a`, `b`.``."""
    line = next(line for line in _section(text).splitlines() if line.startswith("Common ground: "))
    return re.findall(r"`([\w.]+)`", line)


@pytest.fixture(scope="module")
def printed() -> str:
    run = subprocess.run(
        [sys.executable, "hack/features.py", "-q"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


@pytest.fixture(scope="module")
def counted(printed: str) -> dict[str, Figures]:
    found: dict[str, Figures] = {}
    for m in filter(None, map(FIGURES.fullmatch, printed.splitlines())):
        files, common, home, twice = map(int, m.groups()[1:])
        assert files == common + home, f"{m[1]}: its common ground and home do not add up to its files"
        found[m[1]] = (files, common, home, twice)
    assert tuple(found) == FEATURES, f"hack/features.py -q printed {printed!r}"
    return found


def test_the_table_reads_as_the_script_prints() -> None:
    """The parser finds a row for each feature, and the common ground's line (a row or a line it could not
    read would go unchecked)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    assert tuple(_rows(text)) == FEATURES and _common(text)
    row = "| `a-b` | 3 | 1 | 2 | 0 |"
    table = "\n".join([HEADING, "Common ground: `a.b`, `c`.", COLUMNS, row, "## next"])
    assert _rows(table) == {"a-b": (3, 1, 2, 0)} and _common(table) == ["a.b", "c"]


def test_the_table_holds_what_the_script_counts_today(counted: dict[str, Figures], printed: str) -> None:
    text = (REPO / "docs" / "architecture.md").read_text()
    recorded = _rows(text)
    assert counted == recorded, (
        f"hack/features.py -q counts {counted}; docs/architecture.md's table under {HEADING!r} records "
        f"{recorded}. Write the new figures in the table, and say what changed them."
    )
    common = next(m[1].split(", ") for m in map(COMMON.fullmatch, printed.splitlines()) if m)
    assert sorted(common) == sorted(_common(text)), (
        f"hack/features.py -q finds the common ground {common}; docs/architecture.md names {_common(text)}"
    )


def test_each_feature_is_at_home_in_at_most_8_files_none_entered_twice(counted: dict[str, Figures]) -> None:
    over = {name: (home, twice) for name, (*_, home, twice) in counted.items() if home > GOAL_FILES or twice}
    assert not over, f"over issue 56's goal (home, entered twice): {over}"
