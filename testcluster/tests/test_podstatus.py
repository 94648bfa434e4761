"""Pod phase, conditions and container states (podstatus), without a cluster."""

from __future__ import annotations

import pytest

from testcluster.podstatus import ContainerRun, pod_phase, pod_status, termination_message


def _run(name: str, state: str = "running", code: int | None = None, restarts: int = 0) -> ContainerRun:
    run = ContainerRun(name, "img", restart_count=restarts)
    if state in ("running", "terminated"):
        run.started(f"ddpjob://n/{name}", "2026-01-01T00:00:00Z")
    if state == "terminated":
        run.exited(code or 0, "", "2026-01-01T00:00:01Z")
    return run


@pytest.mark.parametrize(
    ("policy", "init", "main", "phase"),
    [
        ("Never", [], [_run("a", "waiting")], "Pending"),
        ("Never", [_run("i")], [_run("a", "waiting")], "Pending"),
        ("Never", [_run("i", "terminated", 1)], [_run("a", "waiting")], "Failed"),
        ("OnFailure", [_run("i", "terminated", 1)], [_run("a", "waiting")], "Pending"),
        ("Never", [_run("i", "terminated", 0)], [_run("a")], "Running"),
        ("Never", [], [_run("a", "terminated", 0), _run("b")], "Running"),
        ("Never", [], [_run("a", "terminated", 0), _run("b", "terminated", 0)], "Succeeded"),
        ("Never", [], [_run("a", "terminated", 0), _run("b", "terminated", 2)], "Failed"),
        ("OnFailure", [], [_run("a", "terminated", 2)], "Running"),
        ("OnFailure", [], [_run("a", "terminated", 0)], "Succeeded"),
        ("Always", [], [_run("a", "terminated", 0)], "Running"),
        ("Always", [], [_run("a", "waiting", restarts=1)], "Running"),
    ],
)
def test_phase(policy: str, init: list[ContainerRun], main: list[ContainerRun], phase: str) -> None:
    assert pod_phase(policy, init, main) == phase


def test_signal_exit_is_reported_as_128_plus_signal() -> None:
    run = _run("a")
    run.exited(-15, "", "t")
    assert (run.exit_code, run.signal, run.reason) == (143, 15, "Error")


def test_status_of_a_running_pod_keeps_scheduler_conditions_and_transition_times() -> None:
    previous = {
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "t0"},
            {"type": "Initialized", "status": "True", "lastTransitionTime": "t1"},
        ],
        "qosClass": "BestEffort",
    }
    status = pod_status(previous, restart_policy="Never", init_runs=[], runs=[_run("a")], pod_ip="10.244.1.2",
                        host_ip="127.0.0.1", start_time="t0", now="t2")  # fmt: skip
    conditions = {c["type"]: c for c in status["conditions"]}
    assert status["phase"] == "Running"
    assert status["podIP"] == "10.244.1.2" and status["podIPs"] == [{"ip": "10.244.1.2"}]
    assert conditions["PodScheduled"]["lastTransitionTime"] == "t0"
    assert conditions["Initialized"]["lastTransitionTime"] == "t1"
    assert conditions["Ready"] == {
        "type": "Ready",
        "status": "True",
        "lastProbeTime": None,
        "lastTransitionTime": "t2",
    }
    assert status["containerStatuses"][0]["state"] == {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    assert status["containerStatuses"][0]["ready"] is True


def test_status_of_a_finished_pod() -> None:
    run = _run("a")
    run.exited(3, "boom", "t3")
    status = pod_status({}, restart_policy="Never", init_runs=[], runs=[run], pod_ip="10.244.1.2",
                        host_ip="127.0.0.1", start_time="t0", now="t3")  # fmt: skip
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    assert status["phase"] == "Failed"
    assert terminated["exitCode"] == 3 and terminated["message"] == "boom" and terminated["reason"] == "Error"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "PodCompleted"


def test_termination_message_falls_back_to_log_tail_only_on_error() -> None:
    log = b"".join(b"line %d\n" % i for i in range(200))
    assert termination_message(b"done", log, policy="FallbackToLogsOnError", exit_code=1) == "done"
    assert termination_message(b"", log, policy="File", exit_code=1) == ""
    assert termination_message(b"", log, policy="FallbackToLogsOnError", exit_code=0) == ""
    tail = termination_message(b"", log, policy="FallbackToLogsOnError", exit_code=1)
    assert tail.endswith("line 199") and "line 119\n" not in tail and len(tail) <= 2048
