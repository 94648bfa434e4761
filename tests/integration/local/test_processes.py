"""`ddpjob local`'s pure parts: the rendered Job's pods as local processes, the policy, the progress line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddp_operator.api.spec import parse
from ddp_operator.api.spec_warnings import not_elastic
from ddp_operator.children import objects
from ddp_operator.local import processes
from ddp_operator.local.notes import local_notes
from ddp_operator.observe import references
from ddp_trainer import contract

DOC: dict[str, Any] = {
    "apiVersion": "ddpjob.io/v1alpha1",
    "kind": "DDPJob",
    "metadata": {"name": "plan", "namespace": "ml"},
    "spec": {"nodes": 3, "procsPerNode": 2, "device": "cpu", "trainer": {"steps": 10}},
}


def _pods(doc: dict[str, Any] = DOC, attempt: int = 2, **kwargs: Any) -> list[processes.LocalPod]:
    options: dict[str, Any] = {"master_port": 40000, "metrics_ports": [41000, 41001, 41002], "host_env": {}}
    options.update(kwargs)
    return processes.local_pods(parse(doc), attempt, Path("/run/plan"), **options)


def test_each_pod_gets_the_kubelet_environment_with_local_addresses() -> None:
    pods = _pods()
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
        assert pod.argv[:5] == [*contract.IMAGE_ENTRYPOINT, "--module", "ddp_trainer"]
        # torchrun's agents meet in the c10d rendezvous on pod 0; pod 0 sorts first, so it holds rank 0
        assert env["PET_RDZV_BACKEND"] == "c10d"
        assert env["PET_RDZV_ENDPOINT"] == "127.0.0.1:40000"
        assert env["PET_LOCAL_ADDR"] == f"127.0.0.{index + 1}"
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
    pod = _pods(doc)[1]
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
    assert _pods(doc, host_env={"API_KEY": "s3cret"})[0].env["API_KEY"] == "s3cret"
    with pytest.raises(processes.LocalError, match=r"API_KEY comes from Secret 'creds'.*export API_KEY="):
        _pods(doc)


def test_the_secrets_and_config_maps_envfrom_names_are_named_as_the_operator_names_them() -> None:
    """Nothing reads them here: the run says so at its start, each by kind, name and field, the words the
    operator's status uses when one is missing on a cluster (observe.references), and what to do instead."""
    doc = {
        **DOC,
        "spec": {
            **DOC["spec"],
            "envFrom": [{"secretRef": {"name": "s3-creds"}}, {"configMapRef": {"name": "settings"}}],
            "checkpoint": {"s3": {"bucket": "ckpt", "credentialsSecret": {"name": "bucket-creds"}}},
        },
    }
    notes = local_notes(parse(doc), contract.FIRST_ATTEMPT, Path("/r"))
    said = [note for note in notes if "Secret s3-creds" in note]
    assert said == [
        "Secret s3-creds (spec.envFrom[0].secretRef), ConfigMap settings (spec.envFrom[1].configMapRef): not "
        "read here (no API server); this machine's environment reaches every pod, so export their variables "
        "before `ddpjob local`"
    ]
    assert any(
        n.startswith("Secret bucket-creds (spec.checkpoint.s3.credentialsSecret): not read") for n in notes
    )
    refs = references.references(parse(doc))
    assert references.named("Secret", "s3-creds", refs) in said[0]


def test_gpus_are_split_between_pods() -> None:
    doc = {**DOC, "spec": {**DOC["spec"], "device": "cuda"}}
    pods = _pods(doc, gpus=list(range(6)))
    assert [pod.env["CUDA_VISIBLE_DEVICES"] for pod in pods] == ["0,1", "2,3", "4,5"]


def test_cuda_job_needs_enough_gpus() -> None:
    spec = parse({**DOC, "spec": {**DOC["spec"], "device": "cuda"}})
    with pytest.raises(
        processes.LocalError, match=r"needs 6 GPUs \(3 nodes × 2 procsPerNode.*has 1: set device: cpu"
    ):
        processes.check_devices(spec, 1)
    processes.check_devices(spec, 6)
    processes.check_devices(parse(DOC), 0)


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
    assert processes.remap(text, {"/checkpoints": Path("/r/ckpt"), "/data": Path("/host/data")}) == expected


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
    _, job = objects.render(parse(doc))
    assert processes.volume_dirs(job, Path("/r")) == {
        "/checkpoints": Path("/r/volumes/checkpoint"),
        "/data": Path("/srv/data"),
        "/scratch": Path("/r/volumes/scratch"),
    }


def test_the_sync_hook_init_container_runs_here_into_the_volume_first_on_pythonpath() -> None:
    """A custom command: the rendered init container's command with its volume mapped to the run folder,
    and the trainer's PYTHONPATH (the hook's folder in front of the user's) mapped the same way."""
    spec = {k: v for k, v in DOC["spec"].items() if k != "trainer"}
    user = [{"name": "PYTHONPATH", "value": "/opt/src"}]
    doc = {**DOC, "spec": {**spec, "command": ["torchrun"], "args": ["train.py"], "env": user}}
    pod = _pods(doc)[0]
    volume = "/run/plan/volumes/ddpjob-sync"
    assert pod.init == (("python", "-m", "ddp_trainer.inject", volume),)
    assert pod.env["PYTHONPATH"] == f"{volume}:/opt/src"
    assert Path(volume) in pod.volumes
    env = processes.init_env({"PYTHONPATH": "/elsewhere", "PATH": "/usr/bin"})
    assert "PYTHONPATH" not in env and env["PATH"].endswith(":/usr/bin")
    assert _pods()[0].init == ()  # the built-in trainer: no hook


def test_the_commands_run_where_ddpjob_local_started_or_in_a_working_dir_this_machine_has() -> None:
    """As torchrun started by hand: in the launch folder, shared by every pod (each keeps its own /tmp);
    spec.workingDir where it is inside a volume (its local folder) or exists here, else the launch folder
    with a note that names the field, its value and where the commands run instead."""
    dirs = {"/checkpoints": Path("/r/volumes/checkpoint")}
    here = Path("/home/me/nanoGPT")
    assert processes.command_dir(None, dirs, here) == (here, None)
    assert processes.command_dir("/checkpoints/src", dirs, here) == (Path("/r/volumes/checkpoint/src"), None)
    assert processes.command_dir("/srv/code", dirs, here, is_dir=lambda p: p == Path("/srv/code")) == (
        Path("/srv/code"),
        None,
    )
    where, note = processes.command_dir("/workspace", dirs, here, is_dir=lambda p: False)
    assert where == here
    assert note == (
        "spec.workingDir /workspace: a folder of the image, not on this machine; the commands run in "
        "/home/me/nanoGPT, where ddpjob local was started"
    )
    pods = _pods(launch_dir=here)
    assert {pod.cwd for pod in pods} == {here}
    assert len({processes.tmp_dir(pod) for pod in pods}) == 3, "each pod's /tmp is its own"


def test_working_dir_is_the_trainer_containers() -> None:
    spec = parse({**DOC, "spec": {**DOC["spec"], "workingDir": "/workspace/nanoGPT"}})
    _, job = objects.render(spec)
    assert job["spec"]["template"]["spec"]["containers"][0]["workingDir"] == "/workspace/nanoGPT"
    _, without = objects.render(parse(DOC))
    assert "workingDir" not in without["spec"]["template"]["spec"]["containers"][0]


def test_an_elastic_job_run_by_torchrun_itself_says_at_the_start_that_it_will_not_resize() -> None:
    spec = {"nodes": 3, "device": "cpu", "elastic": {"minNodes": 1, "maxNodes": 3}, "args": ["train.py"]}
    by_torchrun = parse({**DOC, "spec": {**spec, "command": ["torchrun"]}})
    notes = local_notes(by_torchrun, contract.FIRST_ATTEMPT, Path("/r"))
    assert [n for n in notes if n.startswith("spec.elastic:")] == [not_elastic(by_torchrun)], notes
    launched = local_notes(parse({**DOC, "spec": spec}), contract.FIRST_ATTEMPT, Path("/r"))
    assert not [n for n in launched if n.startswith("spec.elastic:")], launched
