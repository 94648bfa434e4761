"""Suite-wide: the real control plane's fixtures (``cluster``, ``namespace``) for every `cluster` test, a
real S3 server (``s3_server``: MinIO) for the object-storage tests, and the two lanes of a parallel run.

``make test`` runs pytest with two xdist workers (``-n 2 --dist loadgroup``): every `cluster` test in one
lane (one control plane, one operator, tests one after another as before), everything else in the other.
The cluster tier mostly waits (for a node to be declared lost, a grace period, a scrape), so the host tier
runs in that time; within a lane nothing changes, so no test shares a resource it did not share before.
Without ``-n`` the groups are ignored and the suite runs in one process.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["helpers.cluster_fixtures", "helpers.s3server", "helpers.trainer_fixtures"]

CLUSTER_LANE = "cluster"
HOST_LANE = "host"


def lane(item: pytest.Item) -> str:
    """The xdist group of a test: the cluster's or the host's."""
    return CLUSTER_LANE if item.get_closest_marker("cluster") else HOST_LANE


LOAD_SENSITIVE_LAST = (
    "tests/e2e/test_elastic_capacity.py",
    "tests/e2e/test_elastic_nodes.py",
    "tests/e2e/test_faults.py",
    "tests/e2e/test_kueue.py",
    "tests/e2e/test_scale.py",
    "tests/e2e/test_real_nodes.py",
)
"""The cluster lane's long drills (23 of its 45 minutes on 2026-12-04), run at its end, in this order: by
then the host lane (27 minutes) is done or nearly, and a drill alone runs about twice as fast as beside it
(test_elastic_nodes: 198 s alone, 345 s in the suite). test_real_nodes last: moved ahead of these drills by
the first reordering, it ran beside the host lane and took 485 s instead of 251 s (its lost node and
standby drills, 181 and 173 s instead of 116 and 71 s). The real nodes still start in the first test that
asks for them (test_checkpoints); within each lane the order is otherwise the collection's."""


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the group into each test's id
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(lane(item)))
    late = [item for item in items if item.nodeid.split("::")[0] in LOAD_SENSITIVE_LAST]
    if late:
        late.sort(key=lambda item: LOAD_SENSITIVE_LAST.index(item.nodeid.split("::")[0]))  # stable
        items[:] = [item for item in items if item not in late] + late


def pytest_collection_finish(session: pytest.Session) -> None:
    """Under ``--dist loadgroup``, refuses to run if xdist did not put the lanes into the tests' ids (as
    with pytest 9 and xdist 3.8): the cluster tests would be spread over both workers, each starting a
    control plane on the same ports."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    ungrouped = [item.nodeid for item in session.items if not item.nodeid.endswith(f"@{lane(item)}")]
    if ungrouped:
        raise pytest.UsageError(
            f"pytest-xdist did not group {len(ungrouped)} test(s) into lanes (first: {ungrouped[0]}); "
            f"pytest {pytest.__version__} with this xdist cannot run `make test`'s lanes: see pyproject.toml"
        )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Where the suite's time went (issue 55: the suite's budget): each lane's seconds (setup, call and
    teardown of its tests, summed; under ``-n`` the lanes run side by side, so the longer one is the run's
    length) and its ten most expensive test files."""
    lanes: dict[str, float] = {}
    files: dict[tuple[str, str], float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if not isinstance(report, pytest.TestReport):
                continue
            path, _, rest = report.nodeid.partition("::")
            group = rest.rpartition("@")[2] if "@" in rest else "all"
            lanes[group] = lanes.get(group, 0.0) + report.duration
            files[group, path] = files.get((group, path), 0.0) + report.duration
    if not lanes:
        return
    terminalreporter.write_sep("=", "seconds per lane (setup + call + teardown of its tests)")
    for group, seconds in sorted(lanes.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{group}: {seconds:.0f} s ({seconds / 60:.1f} min)")
        top = sorted(((s, p) for (g, p), s in files.items() if g == group), reverse=True)[:10]
        for seconds_in_file, path in top:
            terminalreporter.write_line(f"  {seconds_in_file:7.1f} s  {path}")
