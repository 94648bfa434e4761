"""`ddpjob local` gives pods what a cluster gives them (issue 15): RANK for a plain script, the launch
folder to run in (as torchrun by hand) and a /tmp per pod, volume folders before the pods start, a custom
command's own output, the image's entrypoint for a spec with only args, the logs of an earlier run, and
a file with other kinds in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_trainer import contract
from helpers.local_jobs import job, run_local, unique_name

pytestmark = pytest.mark.slow

PLAIN = """\
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the pod
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
data = sys.argv[1]
assert os.path.isdir(data), data
open(os.path.join(data, f"rank-{dist.get_rank()}"), "w").close()
open(f"here-{os.environ['NODE_RANK']}.txt", "w").write(os.getcwd())
import tempfile; open(os.path.join(tempfile.gettempdir(), "mine"), "w").close()  # the pod's own /tmp
print(f"rank {dist.get_rank()} of {dist.get_world_size()} sum {t.item()} local {os.environ['LOCAL_RANK']}")
dist.destroy_process_group()
"""


def test_a_plain_python_script_gets_its_rank_a_workdir_and_its_volumes(tmp_path: Path) -> None:
    name = unique_name()
    (tmp_path / "plain.py").write_text(PLAIN)
    template = {
        "volumes": [{"name": "data", "emptyDir": {}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    doc = job(name, procsPerNode=1, command=["python", "plain.py", "/data"], podTemplate=template)
    code, out = run_local(tmp_path, [doc])
    assert code == 0, out
    assert f"[{name}-1-0] rank 0 of 2 sum 3.0 local 0" in out, out  # rank 0's own output, without -v
    assert f"[{name}-1-1]" not in out
    run = tmp_path / "runs" / name
    assert sorted(p.name for p in (run / "volumes" / "data").iterdir()) == ["rank-0", "rank-1"]
    for index in (0, 1):  # each pod ran where `ddpjob local` started, and kept a /tmp of its own
        assert (tmp_path / f"here-{index}.txt").read_text() == str(tmp_path)
        assert (run / "attempt-1" / f"{name}-1-{index}" / "tmp" / "mine").is_file()


def test_args_alone_run_after_the_images_torchrun_and_other_kinds_are_skipped(tmp_path: Path) -> None:
    name = unique_name()
    args = ["--nproc-per-node=1", "--module", "ddp_trainer", "--device=cpu", "--steps=10", "--sync-every=5"]
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
    code, out = run_local(tmp_path, [namespace, job(name, nodes=1, procsPerNode=1, args=args)])
    assert code == 0, out
    assert "skipped Namespace/team-a: `ddpjob local` runs the DDPJob only" in out, out
    entrypoint = "(torchrun, under the launcher), " + " ".join(contract.IMAGE_ENTRYPOINT)
    assert f"no spec.command: the args run after the trainer image's entrypoint {entrypoint}" in out, out
    assert f"ddpjob local: {name}: Succeeded" in out


def test_a_second_run_keeps_the_first_runs_logs(tmp_path: Path) -> None:
    name = unique_name()
    fail_once = (
        "import os, sys; mark = sys.argv[1] + '/failed-once'; "
        "print('attempt', os.environ['DDPJOB_ATTEMPT']); "
        "sys.exit(0) if os.path.exists(mark) else (open(mark, 'w').close(), sys.exit(3))"
    )
    template = {
        "volumes": [{"name": "data", "emptyDir": {}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    doc = job(
        name,
        nodes=1,
        procsPerNode=1,
        maxRestarts=0,
        command=["python", "-c", fail_once, "/data"],
        podTemplate=template,
    )
    code, out = run_local(tmp_path, [doc])
    assert code == 1 and f"[{name}-1-0] attempt 1" in out, out
    code, out = run_local(tmp_path, [doc])
    assert code == 0, out
    assert "attempts continue at 2" in out and f"[{name}-2-0] attempt 2" in out, out
    run = tmp_path / "runs" / name
    assert (run / "attempt-1" / f"{name}-1-0.log").read_text() == "attempt 1\n"
    assert (run / "attempt-2" / f"{name}-2-0.log").read_text() == "attempt 2\n"


def test_the_default_relative_workdir_reaches_every_pod(tmp_path: Path) -> None:
    """`make demo` runs with the default `--workdir .ddpjob`, relative to where it is started, while each
    pod runs in a folder of its own: the report, the checkpoints and the logs must still land in the run's
    folder (a relative path handed to a pod once sent them into the pod's own folder, and the summary said
    "sync: not reported")."""
    name = unique_name()
    doc = job(
        name, trainer={"steps": 40, "batchSize": 16, "checkpointEvery": 20}, syncCheck={"everySteps": 20}
    )
    code, out = run_local(tmp_path, [doc], workdir=".ddpjob")
    assert code == 0, out
    assert "verified bit-identical" in out and "not reported" not in out, out
    run = tmp_path / ".ddpjob" / name
    assert sorted(p.name for p in (run / "volumes" / "checkpoint").glob("step-*.pt")), list(run.rglob("*"))
    assert not list((run / "attempt-1").rglob(".ddpjob")), "a pod wrote into a .ddpjob of its own folder"
