"""The walk's figures in docs/architecture.md are the tree's own: the last row of the table under "The walk
through one reconcile" records what ``hack/walk.py -q`` counts for the code as it is, so a change that moves
the figures says so in a new row (issue 56 item 7: docs that cannot drift). The walk runs one reconcile in
about two seconds, so the test runs it whole, in a process of its own, as the doc says to run it (the walk
replaces ``reconcile``'s API calls with nothing, which must not leak into other tests)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEADING = "### The walk through one reconcile"
TOTALS = re.compile(r"stops: (\d+), returns: (\d+), modules: (\d+)")


def _rows(text: str) -> list[tuple[str, tuple[int, int, int]]]:
    """The rows of the walk's table: (what the row says, (stops, returns, modules)), in order."""
    section = text.split(HEADING, 1)[1].split("\n#", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 4 and all(cell.isdigit() for cell in cells[1:]):
            rows.append((cells[0], (int(cells[1]), int(cells[2]), int(cells[3]))))
    return rows


def _walk() -> tuple[int, int, int]:
    run = subprocess.run(
        [sys.executable, "hack/walk.py", "-q"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    found = TOTALS.fullmatch(run.stdout.strip().splitlines()[-1])
    assert found, f"hack/walk.py -q printed no totals: {run.stdout!r}"
    stops, returns, modules = (int(group) for group in found.groups())
    return stops, returns, modules


def test_the_table_reads_as_the_walk_prints() -> None:
    """The parser finds every row of the table, the oldest first (a row it could not read would leave the
    check below comparing against an older figure)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split(HEADING, 1)[1].split("\n#", 1)[0]
    body = [line for line in section.splitlines() if line.startswith("|") and not line.startswith("|--")]
    assert len(_rows(text)) == len(body) - 1 >= 1  # all but the header row
    assert _rows("\n".join([HEADING, "| | stops | returns | modules |", "| a | 3 | 2 | 1 |", "## next"])) == [
        ("a", (3, 2, 1))
    ]


def test_the_last_row_of_the_walks_table_is_what_the_walk_counts_today() -> None:
    recorded_as, recorded = _rows((REPO / "docs" / "architecture.md").read_text())[-1]
    walked = _walk()
    assert walked == recorded, (
        f"hack/walk.py -q counts {walked[0]} stops, {walked[1]} returns and {walked[2]} modules; the last "
        f"row of docs/architecture.md's walk table ({recorded_as!r}) records {recorded}. Add a row that says "
        "what changed the walk, with these figures (or correct the row you added)."
    )
