"""The node agent's pod thread, without a cluster: what it records when a pod is stopped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, cast

from testcluster.layout import Layout
from testcluster.podrunner import NodeInfo, PodRunner


def _runner(tmp_path: Path) -> PodRunner:
    pod = {
        "metadata": {"uid": "0123456789ab", "namespace": "ns", "name": "p"},
        "spec": {"containers": [{"name": "trainer", "image": "img"}], "restartPolicy": "Never"},
    }
    node = NodeInfo("node-1", 1, "10.0.0.1", "10.244.1.0/24")
    return PodRunner(
        kube=cast(Any, None), layout=Layout(tmp_path), node=node, pod=pod, pod_ip="10.244.1.2", on_exit=print
    )


def test_a_container_that_exited_just_before_the_stop_is_recorded_as_terminated(tmp_path: Path) -> None:
    """The container ended on its own in the instant between the agent's last look and the deletion: its
    exit code and termination message are still recorded (a kubelet's are), not left "running" in a pod
    whose phase says Failed. Left running, rank 0's report was lost and a preemption taken for a crash."""
    runner = _runner(tmp_path)
    runner.dir.mkdir(parents=True)
    (runner.dir / "trainer.termination-log").write_text('{"result": "Interrupted"}')
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(143)"])
    proc.wait()  # gone, and already reaped: poll() no longer says it runs
    runner._procs["trainer"] = proc
    runner.runs[0].started("ddpjob://node-1/1", "2026-01-01T00:00:00Z")

    runner._kill_all(1.0)

    run = runner.runs[0]
    assert (run.state, run.exit_code) == ("terminated", 143), run
    assert "Interrupted" in run.message, run
