"""`ddpjob local`'s pure parts: pods planned from the rendered Job, the policy, the progress line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddp_operator import policy, progress, render
from ddp_operator.local import host
from ddp_operator.local import plan as local
from ddp_operator.local.run import sync_sentence
from ddp_operator.spec import parse
from ddp_trainer import contract

DOC: dict[str, Any] = {
    "apiVersion": "ddpjob.io/v1alpha1",
    "kind": "DDPJob",
    "metadata": {"name": "plan", "namespace": "ml"},
    "spec": {"nodes": 3, "procsPerNode": 2, "device": "cpu", "trainer": {"steps": 10}},
}


def _plan(doc: dict[str, Any] = DOC, attempt: int = 2, **kwargs: Any) -> list[local.LocalPod]:
    options: dict[str, Any] = {"master_port": 40000, "metrics_ports": [41000, 41001, 41002], "host_env": {}}
    options.update(kwargs)
    return local.plan_pods(parse(doc), attempt, Path("/run/plan"), **options)


def test_each_pod_gets_the_kubelet_environment_with_local_addresses() -> None:
    pods = _plan()
    assert [pod.name for pod in pods] == ["plan-2-0", "plan-2-1", "plan-2-2"]
    for index, pod in enumerate(pods):
        env = pod.env
        assert env["PET_NODE_RANK"] == env["NODE_RANK"] == str(index)
        assert env["PET_MASTER_ADDR"] == env["MASTER_ADDR"] == "127.0.0.1"
        assert env["PET_MASTER_PORT"] == env["MASTER_PORT"] == "40000"
        assert env["WORLD_SIZE"] == "6"
        assert env["DDPJOB_NAMESPACE"] == "ml"
        assert env["DDPJOB_ATTEMPT"] == "2"
        assert env["DDPJOB_METRICS_PORT"] == str(41000 + index)
        assert env["DDPJOB_TERMINATION_LOG"] == f"/run/plan/attempt-2/plan-2-{index}.termination-log"
        assert pod.argv[:3] == ["torchrun", "--module", "ddp_trainer"]
        assert "--checkpoint-dir=/run/plan/volumes/checkpoint" in pod.argv
        assert pod.log_path == Path(f"/run/plan/attempt-2/plan-2-{index}.log")


def test_user_env_still_wins_and_expands() -> None:
    doc = {
        **DOC,
        "spec": {
            **DOC["spec"],
            "command": ["torchrun"],
            "args": ["train.py", "--out=/checkpoints/x"],
            "env": [
                {"name": "MASTER_PORT", "value": "23456"},
                {"name": "PET_MASTER_PORT", "value": "$(MASTER_PORT)"},
                {"name": "TAG", "value": "$(DDPJOB_NAME)-$(NODE_RANK)"},
            ],
        },
    }
    pod = _plan(doc)[1]
    assert pod.env["MASTER_PORT"] == pod.env["PET_MASTER_PORT"] == "23456"
    assert pod.env["TAG"] == "plan-1"
    assert pod.argv == ["torchrun", "train.py", "--out=/run/plan/volumes/checkpoint/x"]


def test_secrets_come_from_this_machine_or_are_named() -> None:
    doc = {
        **DOC,
        "spec": {
            **DOC["spec"],
            "env": [{"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "key"}}}],
        },
    }
    assert _plan(doc, host_env={"API_KEY": "s3cret"})[0].env["API_KEY"] == "s3cret"
    with pytest.raises(local.LocalError, match=r"API_KEY comes from Secret 'creds'.*export API_KEY="):
        _plan(doc)


def test_gpus_are_split_between_pods() -> None:
    doc = {**DOC, "spec": {**DOC["spec"], "device": "cuda"}}
    pods = _plan(doc, gpus=list(range(6)))
    assert [pod.env["CUDA_VISIBLE_DEVICES"] for pod in pods] == ["0,1", "2,3", "4,5"]


def test_cuda_job_needs_enough_gpus() -> None:
    spec = parse({**DOC, "spec": {**DOC["spec"], "device": "cuda"}})
    with pytest.raises(
        local.LocalError, match=r"needs 6 GPUs \(3 nodes × 2 procsPerNode.*has 1: set device: cpu"
    ):
        local.check_devices(spec, 1)
    local.check_devices(spec, 6)
    local.check_devices(parse(DOC), 0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/checkpoints", "/r/ckpt"),
        ("/checkpoints/a/b", "/r/ckpt/a/b"),
        ("--checkpoint-dir=/checkpoints", "--checkpoint-dir=/r/ckpt"),
        ("/checkpointsX", "/checkpointsX"),
        ("--data=/data/train", "--data=/host/data/train"),
        ("relative/checkpoints", "relative/checkpoints"),
    ],
)
def test_remap(text: str, expected: str) -> None:
    assert local.remap(text, {"/checkpoints": Path("/r/ckpt"), "/data": Path("/host/data")}) == expected


def test_host_path_volumes_are_themselves() -> None:
    doc = {
        **DOC,
        "spec": {
            **DOC["spec"],
            "podTemplate": {
                "volumes": [
                    {"name": "data", "hostPath": {"path": "/srv/data"}},
                    {"name": "scratch", "emptyDir": {}},
                ],
                "volumeMounts": [
                    {"name": "data", "mountPath": "/data"},
                    {"name": "scratch", "mountPath": "/scratch"},
                ],
            },
        },
    }
    _, job = render.render(parse(doc))
    assert local.volume_dirs(job, Path("/r")) == {
        "/checkpoints": Path("/r/volumes/checkpoint"),
        "/data": Path("/srv/data"),
        "/scratch": Path("/r/volumes/scratch"),
    }


def test_run_dir_resumes_unless_the_last_run_succeeded(tmp_path: Path) -> None:
    checkpoint = tmp_path / "volumes" / "checkpoint"
    checkpoint.mkdir(parents=True)
    (checkpoint / "step-00000020.pt").write_bytes(b"x")
    host.write_state(tmp_path, "Interrupted")
    note = host.prepare_run_dir(tmp_path, fresh=False)
    assert note is not None and "resuming" in note and "Interrupted" in note
    assert (checkpoint / "step-00000020.pt").exists()
    host.write_state(tmp_path, "Succeeded")
    assert host.prepare_run_dir(tmp_path, fresh=False) is None
    assert not tmp_path.exists()


POLICY = [
    ("success", policy.Outcome(True), 1, 3, policy.Action.SUCCEED, "Completed"),
    (
        "first failure restarts",
        policy.Outcome(False, {0: 0, 1: 1}),
        1,
        3,
        policy.Action.RESTART,
        "AttemptFailed",
    ),
    ("last restart used", policy.Outcome(False, {0: 1}), 4, 3, policy.Action.FAIL, "MaxRestartsExceeded"),
    ("no restarts allowed", policy.Outcome(False, {0: 137}), 1, 0, policy.Action.FAIL, "AttemptFailed"),
    (
        "divergence by report",
        policy.Outcome(False, {0: 1}, {"result": "Diverged", "message": "w differs"}),
        1,
        3,
        policy.Action.FAIL,
        "SyncDivergence",
    ),
    (
        "divergence by exit code",
        policy.Outcome(False, {1: contract.DIVERGENCE_EXIT_CODE}),
        1,
        3,
        policy.Action.FAIL,
        "SyncDivergence",
    ),
    (
        "invalid spec",
        policy.Outcome(False, reason="InvalidSpec", message="no such command"),
        1,
        3,
        policy.Action.FAIL,
        "InvalidSpec",
    ),
    (
        "deadline passed",
        policy.Outcome(False, {0: 137}, reason="DeadlineExceeded"),
        1,
        3,
        policy.Action.FAIL,
        "DeadlineExceeded",
    ),
    (
        "crash report still restarts",
        policy.Outcome(False, {0: 1}, {"result": "Failed"}),
        2,
        3,
        policy.Action.RESTART,
        "AttemptFailed",
    ),
]


@pytest.mark.parametrize(
    ("outcome", "attempt", "max_restarts", "action", "reason"),
    [c[1:] for c in POLICY],
    ids=[c[0] for c in POLICY],
)
def test_policy(
    outcome: policy.Outcome, attempt: int, max_restarts: int, action: policy.Action, reason: str
) -> None:
    decision = policy.decide(outcome, attempt, max_restarts)
    assert (decision.action, decision.reason) == (action, reason)
    assert decision.message


def test_restart_message_counts_restarts() -> None:
    decision = policy.decide(policy.Outcome(False, {0: 0, 1: 137}), 2, 3)
    assert decision.message == "attempt 2 failed (node 1 exited 137); gang restart 2 of 3"


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


METRICS_POD0 = """
ddp_steps_total{job="j",namespace="n",node_rank="0",rank="0"} 40.0
ddp_steps_total{job="j",namespace="n",node_rank="0",rank="1"} 41.0
ddp_samples_total{job="j",namespace="n",node_rank="0",rank="0"} 1280.0
ddp_samples_total{job="j",namespace="n",node_rank="0",rank="1"} 1312.0
ddp_loss{job="j",namespace="n",node_rank="0",rank="0"} 0.5
ddp_loss{job="j",namespace="n",node_rank="0",rank="1"} 0.7
ddp_sync_checks_total{job="j",kind="periodic",namespace="n",node_rank="0",rank="0",result="ok"} 2.0
ddp_sync_checks_total{job="j",kind="initial",namespace="n",node_rank="0",rank="0",result="ok"} 1.0
ddp_sync_checks_total{job="j",kind="periodic",namespace="n",node_rank="0",rank="1",result="ok"} 3.0
"""
METRICS_POD1 = """
ddp_steps_total{job="j",namespace="n",node_rank="1",rank="2"} 42.0
ddp_samples_total{job="j",namespace="n",node_rank="1",rank="2"} 1344.0
ddp_sync_checks_total{job="j",kind="periodic",namespace="n",node_rank="1",rank="2",result="mismatch"} 1.0
"""


def test_progress_from_metrics() -> None:
    now = progress.parse([METRICS_POD0, METRICS_POD1])
    assert now == progress.Progress(
        step=40, samples=3936.0, loss=0.5, checks_ok=3, checks_mismatch=0, ranks=3
    )
    first = progress.Progress(samples=936.0)
    assert progress.line(now, 200, 2.0, first) == (
        "step 40/200 (20%)  loss 0.5000  1,500 samples/s  sync checks: 3 ok"
    )
    assert "1 MISMATCH" in progress.line(progress.parse([METRICS_POD1]), 200, 1.0)


def test_sync_sentence() -> None:
    assert sync_sentence(
        {"verified": True, "checks": 7, "worldSize": 4, "lastCheckStep": 300, "repairs": 0}
    ) == ("replicas verified bit-identical 7 times across 4 ranks (last check at step 300)")
    diverged = sync_sentence(
        {
            "verified": False,
            "checks": 3,
            "mismatches": 1,
            "mismatchedTensors": ["0.weight"],
            "message": "rank 1 differs",
        }
    )
    assert diverged.startswith("replicas DIVERGED: 1 of 3 checks found ranks differing (0.weight)")
    assert sync_sentence(None).startswith("not reported")
