"""Live progress on the real control plane: the operator (a process on the host) reads the trainer's
/metrics from the pods over the pod network (10.244.x.y through the bridge), and the status tells the truth
while the job runs."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from helpers.e2e import Operator, get, real_ddpjob, wait_phase
from testcluster.fixtures import Cluster, wait_for
from testcluster.nodeconfig import RealNode

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _apply(cluster: Cluster, namespace: str, doc: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))


def _status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = get(cluster, namespace, name).get("status", {})
    return status


def _conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions", [])}


def _events(cluster: Cluster, namespace: str, name: str) -> str:
    return cluster.kubectl(
        "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}"
    ).stdout


def test_a_running_job_shows_its_progress_eta_throughput_and_live_sync(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode]
) -> None:
    doc = real_ddpjob("live", trainer={"steps": 200000, "checkpointEvery": 0}, syncCheck={"everySteps": 50})
    _apply(cluster, namespace, doc)

    def progressing() -> dict[str, Any] | None:
        status = _status(cluster, namespace, "live")
        return status if status.get("progress", {}).get("step", 0) > 0 else None

    first = wait_for(progressing, what="status.progress.step > 0", timeout=180, every=1)
    assert first["phase"] == "Running", first
    progress = first["progress"]
    assert progress["totalSteps"] == 200000 and 0 <= progress["percent"] < 100
    assert progress["summary"] == f"{progress['percent']}%"
    assert progress["samplesPerSecond"] > 0 and progress["stepsPerSecond"] > 0
    # ETA is plausible: what is left at the measured rate, give or take the rounding.
    left = (200000 - progress["step"]) / progress["stepsPerSecond"]
    assert abs(progress["etaSeconds"] - left) <= 1 + 0.01 * left, progress
    assert progress["etaTime"] > progress["computedAt"] and progress["eta"]
    assert "slowestRank" in progress and progress["slowestRank"] in (0, 1)
    assert _conditions(first)["MetricsScraped"]["status"] == "True", first

    last: list[dict[str, Any]] = []

    def advanced() -> dict[str, Any] | None:
        status = _status(cluster, namespace, "live")
        last[:] = [status]
        later = status.get("sync", {}).get("checks", 0) > first.get("sync", {}).get("checks", 0)
        # Every pod answers (at the first read one may not have listened yet).
        heard = "unreachable" not in status["progress"]
        return status if status["progress"]["step"] > progress["step"] and later and heard else None

    try:
        second = wait_for(advanced, what="the step and the sync checks to advance", timeout=60, every=1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; first: {first}; last: {last}") from None
    assert _conditions(second)["MetricsScraped"]["reason"] == "Scraped"
    assert second["progress"]["computedAt"] > progress["computedAt"]
    computed = [
        second["progress"]["computedAt"],
        progress["computedAt"],
    ]
    assert computed[0] != computed[1]
    sync = second["sync"]
    assert sync["verified"] is True and sync["lastCheckResult"] == "BitIdentical", sync
    assert sync["lastCheckStep"] % 50 == 0 and sync["lastCheckTime"], sync
    assert _conditions(second)["SyncVerified"]["status"] == "True"
    print(f"status mid-run: {json.dumps({k: second[k] for k in ('phase', 'progress', 'sync')})}")

    # At most one progress write per 10 s: over 12 s, computedAt takes at most two values.
    seen = set()
    started = time.monotonic()
    while time.monotonic() - started < 12:
        seen.add(_status(cluster, namespace, "live")["progress"]["computedAt"])
        time.sleep(0.5)
    assert 1 <= len(seen) <= 2, seen

    table = cluster.kubectl("get", "ddpj", "live", "-n", namespace).stdout
    print(table)
    header, row = (line.split() for line in table.strip().splitlines())
    assert header == ["NAME", "PHASE", "REASON", "NODES", "ATTEMPT", "SYNC", "PROGRESS", "ETA", "AGE"]
    assert row[:6] == ["live", "Running", "AllNodesReady", "2", "1", "true"]
    assert row[6].endswith("%") and row[7][-1] in "smh", row
    assert "SyncVerified" in _events(cluster, namespace, "live")
    cluster.kubectl("delete", "ddpjob", "live", "-n", namespace, "--wait=true", "--timeout=60s")


def test_a_command_without_metrics_runs_healthy_and_the_status_says_so(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode]
) -> None:
    doc = real_ddpjob("quiet", command=["python", "-c", "import time; time.sleep(30)"])
    _apply(cluster, namespace, doc)

    def said() -> dict[str, Any] | None:  # the first pod may be read before the second one is ready
        status = _status(cluster, namespace, "quiet")
        return (
            status if "MetricsScraped" in _conditions(status) and status.get("phase") == "Running" else None
        )

    status = wait_for(
        said, what="the status to say Running and that the pods export no metrics", timeout=120, every=1
    )
    assert status["phase"] == "Running", status
    metrics = _conditions(status)["MetricsScraped"]
    assert (metrics["status"], metrics["reason"]) == ("False", "NoMetrics"), metrics
    assert "port 9400" in metrics["message"]
    pods = cluster.kubectl_json("get", "pods", "-n", namespace, "-l", "ddpjob.io/job-name=quiet")["items"]
    # The pods that were running at the read (the other may still have been starting).
    assert set(status["progress"]["unreachable"]) <= {pod["metadata"]["name"] for pod in pods}, status
    assert status["progress"]["unreachable"], status
    assert "step" not in status["progress"]
    done = wait_phase(cluster, namespace, "quiet", "Succeeded", "Failed", timeout=120)["status"]
    assert done["phase"] == "Succeeded", done
    assert "step" not in done.get("progress", {}) and "sync" not in done
    events = _events(cluster, namespace, "quiet")
    assert "Warning" not in events, events
    assert "completed in" in events


def test_a_plain_script_runs_to_succeeded_with_no_progress_and_no_error(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode]
) -> None:
    _apply(cluster, namespace, real_ddpjob("plain", command=["python", "-c", "print('trained')"]))
    done = wait_phase(cluster, namespace, "plain", "Succeeded", "Failed", timeout=120)["status"]
    assert done["phase"] == "Succeeded", done
    assert "step" not in done.get("progress", {})
    assert _conditions(done).get("MetricsScraped", {}).get("reason") in (None, "NoMetrics")
    assert "Warning" not in _events(cluster, namespace, "plain")


def test_a_divergence_and_its_repair_are_said_while_the_job_runs(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode]
) -> None:
    doc = real_ddpjob(
        "repaired",
        trainer={"steps": 200000, "checkpointEvery": 0},
        syncCheck={"everySteps": 50, "onDivergence": "Repair"},
        env=[{"name": "DDPJOB_CHAOS_DIVERGE", "value": "rank=1,step=120"}],
    )
    _apply(cluster, namespace, doc)

    def repaired() -> dict[str, Any] | None:
        status = _status(cluster, namespace, "repaired")
        sync = status.get("sync", {})
        return status if sync.get("mismatches", 0) >= 1 and sync.get("repairs", 0) >= 1 else None

    status = wait_for(repaired, what="status.sync to count a mismatch and its repair", timeout=180, every=1)
    assert status["phase"] == "Running" and status["sync"]["verified"] is True, status

    # The events follow the status patch: wait for them.
    def posted() -> str | None:
        text = _events(cluster, namespace, "repaired")
        return text if "SyncRepaired" in text else None

    events = wait_for(posted, what="the SyncRepaired event", timeout=30)
    print(events)
    assert "SyncDivergence" in events and "differing" in events, events
    cluster.kubectl("delete", "ddpjob", "repaired", "-n", namespace, "--wait=true", "--timeout=60s")
