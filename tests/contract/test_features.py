"""Each feature's figures in docs/architecture.md are the tree's own: the table under "Each feature's home"
records what ``hack/features.py -q`` counts for the code as it is (issue 56: each of six features at home in
at most 8 files, none entered twice, and a script that counts them so the figure can be checked again). The
script follows each feature's entrances in a process of its own (it forms a one-process gloo group, which
must not leak into other tests), in about ten seconds."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEADING = "### Each feature's home"
FIGURES = re.compile(r"([a-z-]+): files (\d+), entered twice (\d+)")
FEATURES = (
    "elastic-resize",
    "fingerprint-check",
    "restart-in-place",
    "compute-probe",
    "kueue-reason",
    "checkpoint-identity",
)
GOAL_FILES = 8


def _rows(text: str) -> dict[str, tuple[int, int]]:
    """The rows of the features' table: feature → (files, entered twice)."""
    section = text.split(HEADING, 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3 and all(cell.isdigit() for cell in cells[1:]):
            rows[cells[0]] = (int(cells[1]), int(cells[2]))
    return rows


@pytest.fixture(scope="module")
def counted() -> dict[str, tuple[int, int]]:
    run = subprocess.run(
        [sys.executable, "hack/features.py", "-q"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    found = {m[1]: (int(m[2]), int(m[3])) for m in map(FIGURES.fullmatch, run.stdout.splitlines()) if m}
    assert tuple(found) == FEATURES, f"hack/features.py -q printed {run.stdout!r}"
    return found


def test_the_table_reads_as_the_script_prints() -> None:
    """The parser finds a row for each feature (a row it could not read would go unchecked)."""
    assert tuple(_rows((REPO / "docs" / "architecture.md").read_text())) == FEATURES
    table = "\n".join([HEADING, "| feature | files | entered twice |", "| `a-b` | 3 | 0 |", "## next"])
    assert _rows(table) == {"a-b": (3, 0)}


def test_the_table_holds_what_the_script_counts_today(counted: dict[str, tuple[int, int]]) -> None:
    recorded = _rows((REPO / "docs" / "architecture.md").read_text())
    assert counted == recorded, (
        f"hack/features.py -q counts {counted}; docs/architecture.md's table under {HEADING!r} records "
        f"{recorded}. Write the new figures in the table, and say what changed them."
    )


@pytest.mark.xfail(
    strict=True,
    reason="issue 56's goal is not met yet (docs/architecture.md says which features are over it); once it "
    "is, this test passes, and strict xfail fails until this marker is removed",
)
def test_each_feature_is_at_home_in_at_most_8_files_none_entered_twice(
    counted: dict[str, tuple[int, int]],
) -> None:
    over = {name: figures for name, figures in counted.items() if figures[0] > GOAL_FILES or figures[1]}
    assert not over, f"over issue 56's goal (files, entered twice): {over}"
