"""The operator's side and the trainer's side of the pod contract agree (they ship as two images).

The round trip renders a DDPJob's pod for attempt 1 and attempt 2, resolves its environment as the
kubelet would, runs the real trainer in it, and reads what the trainer wrote (termination report,
metrics) back through the operator's own status code. Any drift between the halves fails here.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from ddp_operator.api import names
from ddp_operator.api.spec import parse, parse_file
from ddp_operator.children import container, render
from ddp_operator.decide import decision, restarts, sync_check
from ddp_operator.local import host, processes
from ddp_trainer import contract
from ddp_trainer.core.config import parse_args, read_pod_env
from ddp_trainer.core.distributed import apply_env_defaults
from helpers.reconciling import observed

REPO = Path(__file__).resolve().parents[2]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _job(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ddpjob.io/v1alpha1",
        "kind": "DDPJob",
        "metadata": {"name": name, "namespace": "contract"},
        "spec": {"nodes": 1, "procsPerNode": 1, "device": "cpu", "image": "x", **spec},
    }


def test_divergence_exit_code_is_the_policys_signal() -> None:
    outcome = restarts.Outcome(False, {0: contract.DIVERGENCE_EXIT_CODE})
    assert restarts.decide(outcome, 1, 3).reason == "SyncDivergence"
    assert restarts.decide(restarts.Outcome(False, {0: contract.FAILURE_EXIT_CODE}), 1, 3).reason != (
        "SyncDivergence"
    )


def test_rendered_trainer_flags_are_the_trainers() -> None:
    (spec,) = parse_file(REPO / "examples" / "multinode-gpu.yaml")
    config = parse_args(container.trainer_args(spec))
    for field, value in container.trainer_values(spec).items():
        assert getattr(config, field) == value, field
    assert (config.device, config.backend, config.checkpoint_dir) == ("cuda", "nccl", "/checkpoints")


def test_rendered_nccl_settings_are_the_trainers_and_the_docs() -> None:
    (spec,) = parse_file(REPO / "examples" / "multinode-gpu.yaml")
    rendered = _env(
        render.render_job(spec, contract.FIRST_ATTEMPT)["spec"]["template"]["spec"]["containers"][0]
    )
    filled: dict[str, str] = {}
    apply_env_defaults(filled, "cuda")
    docs = (REPO / "docs" / "trainer.md").read_text()
    for name, value in contract.NCCL_ENV_DEFAULTS.items():
        expected = str(spec.nccl.trace_buffer_size) if name == "TORCH_NCCL_TRACE_BUFFER_SIZE" else value
        assert rendered[name] == expected, name
        assert filled[name] == value, name
        assert f"`{name}={value}`" in docs, f"docs/trainer.md does not say {name}={value}"


def test_rendered_pod_environment_reads_back_as_the_trainers_pod_env() -> None:
    spec = parse(_job("envjob", env=[{"name": "EXTRA", "value": "1"}]))
    for attempt in (contract.FIRST_ATTEMPT, contract.FIRST_ATTEMPT + 1):
        (pod,) = processes.local_pods(
            spec, attempt, Path("/run"), master_port=1, metrics_ports=[9], host_env={}
        )
        env = read_pod_env(pod.env)
        assert (env.job, env.namespace, env.attempt, env.metrics_port) == ("envjob", "contract", attempt, 9)
        assert contract.restarts_before(env.attempt) == attempt - 1
    with pytest.raises(ValueError, match=contract.ATTEMPT_ENV):
        read_pod_env({contract.ATTEMPT_ENV: "0"})


def _restarts_metric(directory: Path) -> float:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    values = [s.value for m in registry.collect() for s in m.samples if s.name == contract.RESTARTS]
    assert values, f"no {contract.RESTARTS} in {directory}"
    return float(values[0])


def _pod_with_report(job: dict[str, Any], message: str, code: int) -> dict[str, Any]:
    pod = processes.pod_object(job, 0)
    terminated = {"exitCode": code, "message": message}
    pod["status"] = {
        "containerStatuses": [{"name": names.CONTAINER_NAME, "state": {"terminated": terminated}}]
    }
    return pod


@pytest.mark.slow
@pytest.mark.parametrize("attempt", [contract.FIRST_ATTEMPT, contract.FIRST_ATTEMPT + 1])
def test_round_trip_render_run_the_trainer_read_the_status(tmp_path: Path, attempt: int) -> None:
    spec = parse(_job("roundtrip", trainer={"steps": 4, "batchSize": 8}, syncCheck={"everySteps": 2}))
    assert spec.sync_check.every_steps == 2
    (pod,) = processes.local_pods(
        spec,
        attempt,
        tmp_path,
        master_port=host.free_port(),
        metrics_ports=[0],
        host_env={},
    )
    metrics_dir = tmp_path / "metrics"
    host_env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPJOB_", "PROMETHEUS_", "PET_"))}
    host_env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    pod.termination_path.parent.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(
        pod.argv, env=processes.process_env(pod, host_env), capture_output=True, text=True, timeout=240
    )
    assert run.returncode == contract.SUCCESS_EXIT_CODE, run.stderr[-3000:]

    # The trainer's side, read with the operator's code.
    message = pod.termination_path.read_text()
    report = contract.parse_report(message)
    assert report is not None and report["result"] == contract.SUCCEEDED
    assert report["attempt"] == attempt and report["step"] == 4 and report["verified"]
    assert _restarts_metric(metrics_dir) == contract.restarts_before(attempt)

    job = render.render_job(spec, attempt)
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    previous = {"attempt": attempt, "phase": "Running", "startTime": "2026-01-01T00:00:00Z"}
    now = dt.datetime(2026, 1, 1, 0, 1, tzinfo=dt.UTC)
    body = {**_job("roundtrip"), "status": previous}
    body["spec"] = {**body["spec"], "trainer": {"steps": 4, "batchSize": 8}, "syncCheck": {"everySteps": 2}}
    written = decision.decide(observed(body, [job], [_pod_with_report(job, message, 0)], now)).status
    assert written["phase"] == "Succeeded"
    assert (written["attempt"], written["restarts"]) == (attempt, contract.restarts_before(attempt))
    assert written["sync"] == {
        **sync_check.from_report(report),
        "attempts": [  # the job's checks per attempt (issue 58 item 3): this one's, of its one world
            {
                "attempt": attempt,
                "checks": report["checks"],
                "mismatches": 0,
                "repairs": 0,
                "worlds": 1,
                "resumedFromStep": 0,
            }
        ],
    }
    assert written["sync"]["checks"] == report["checks"] >= 3  # initial, steps 2 and 4


@pytest.mark.parametrize("source", contract.RESTART_FROM)
def test_restarts_in_place_round_trip_from_the_trainers_report_to_the_status(source: str) -> None:
    """The restarts in place, the cause and where the restarted workers' state came from that the
    trainer's report states (written by reporting.report, through the termination message) are what the
    operator's status counts and says: one key on both sides, contract.REPORT_RESTARTS_IN_PLACE (the
    metric, contract.RESTARTS_IN_PLACE, is another name)."""
    from ddp_trainer.reporting import report as trainer_report
    from ddp_trainer.sync.checking import Tally

    cause = "rank 1 exited 1: RuntimeError: boom"
    facts = trainer_report.RunFacts(
        4, 2, 2, contract.FIRST_ATTEMPT, restarts_in_place=2, last_restart=cause, last_restart_from=source
    )
    tally = Tally(checks=3, last_check_step=4, last_check_ok=True)
    _, written_report = trainer_report.finished(tally, facts, 4, "digest")
    message = trainer_report.termination_message(written_report)
    report = contract.parse_report(message)
    assert report is not None
    assert (report[contract.REPORT_RESTARTS_IN_PLACE], report[contract.REPORT_LAST_RESTART]) == (2, cause)

    spec = parse(_job("inplace"))
    job = render.render_job(spec, contract.FIRST_ATTEMPT)
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    previous = {"attempt": contract.FIRST_ATTEMPT, "phase": "Running", "startTime": "2026-01-01T00:00:00Z"}
    body = {**_job("inplace"), "status": previous}
    now = dt.datetime(2026, 1, 1, 0, 1, tzinfo=dt.UTC)
    written = decision.decide(observed(body, [job], [_pod_with_report(job, message, 0)], now)).status
    assert written["phase"] == "Succeeded"
    assert (written["restarts"], written[restarts.RESTARTS_IN_PLACE_FIELD]) == (2, 2)
    last = written[restarts.LAST_RESTART_FIELD]
    assert (last["kind"], last["inAttempt"]) == (restarts.IN_PLACE, 2) and cause in last["message"]
    assert last["message"].endswith(restarts.RESUMING_FROM[source]), last["message"]


@pytest.mark.parametrize("source", contract.RESTART_FROM)
def test_where_a_restarts_workers_took_their_state_from_round_trips_from_the_trainers_series(
    source: str, tmp_path: Path
) -> None:
    """The launch state a restarted pod's launcher wrote (core.inplace) → its workers' series
    (reporting.metrics, ``ddp_last_restart_info``) → the operator's reading (observe.metrics.parse): the
    cause and where the state came from arrive as written, and the other pod's "another node" does not win
    the cause; a series without the label (an older trainer) reads as the checkpoint."""
    from prometheus_client import generate_latest

    from ddp_operator.observe import metrics as operator_metrics
    from ddp_trainer.core import inplace
    from ddp_trainer.reporting.metrics import TrainerMetrics

    texts = []
    for rank, state in enumerate(
        [
            inplace.LaunchState(1, "rank 1 (pid 7) was killed by SIGKILL", 1.0, restart_from=source),
            inplace.LaunchState(1, contract.OTHER_NODE_FAILED, 1.0),
        ]
    ):
        registry = CollectorRegistry()
        labels = {"ddpjob": "j", "ddpjob_namespace": "n", "rank": str(rank), "node_rank": str(rank)}
        inplace.write_state(path := tmp_path / f"launch-{rank}.json", state)  # the launcher's file
        read_back = inplace.read_state({contract.LAUNCH_STATE_ENV: str(path)})  # its worker's reading
        assert read_back == state
        TrainerMetrics(labels, {}, registry).restarted(
            read_back.restarts, read_back.cause, read_back.restart_from
        )
        texts.append(generate_latest(registry).decode())
    read = operator_metrics.parse(texts)
    assert (read.restarts_in_place, read.restart_cause, read.restart_from) == (
        1,
        "rank 1 (pid 7) was killed by SIGKILL",
        source,
    )
    older = texts[0].replace(f',{contract.RESTART_FROM_LABEL}="{source}"', "")
    assert contract.RESTART_FROM_LABEL not in older
    assert operator_metrics.parse([older]).restart_from == contract.RESTART_FROM_CHECKPOINT


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"result": "Succeeded", "checks": 3}', {"result": "Succeeded", "checks": 3}),
        ("Traceback (most recent call last):", None),
        ('["not", "a", "report"]', None),
        ("", None),
        (None, None),
    ],
)
def test_parse_report(text: str | None, expected: dict[str, Any] | None) -> None:
    assert contract.parse_report(text) == expected


def test_crd_defaults_are_the_trainers_defaults() -> None:
    """A DDPJob that sets nothing trains exactly as `torchrun --module ddp_trainer` with no flags: the CRD's
    defaults, mapped to trainer flags by container.trainer_values (the one mapping), equal TrainerConfig's."""
    import dataclasses

    from ddp_operator.api.spec import parse
    from ddp_operator.children import container
    from ddp_trainer.core.config import TrainerConfig

    doc = {
        "apiVersion": "ddpjob.io/v1alpha1",
        "kind": "DDPJob",
        "metadata": {"name": "d"},
        "spec": {"nodes": 1},
    }
    values = container.trainer_values(parse(doc))
    defaults = {f.name: f.default for f in dataclasses.fields(TrainerConfig)}
    # where the pod differs on purpose: the device the spec asks for, and the checkpoint volume's path
    for own in ("device", "backend", "checkpoint_dir"):
        values.pop(own)
    assert values == {name: defaults[name] for name in values}
    assert {"steps", "learning_rate", "checkpoint_every", "sync_every", "model"} <= set(values)
