"""A script named by a relative path: found in the current directory or next to the DDPJob file, and a
missing one said before any pod starts (`ddpjob local`) or as a warning (`ddpjob validate`)."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from ddp_operator.api.spec import parse, parse_file
from ddp_operator.local import scripts
from helpers.local_jobs import job, run_local, unique_name


def write_job(path: Path, name: str, args: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "apiVersion": "ddpjob.io/v1alpha1",
        "kind": "DDPJob",
        "metadata": {"name": name},
        "spec": {"nodes": 1, "procsPerNode": 1, "device": "cpu", "command": ["python"], "args": args},
    }
    path.write_text(yaml.safe_dump(doc))


def ddpjob(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "ddp_operator", *argv]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=180, check=False)


def test_missing_names_the_field_the_value_and_where_it_looked(tmp_path: Path) -> None:
    write_job(tmp_path / "job.yaml", "x", ["-u", "train.py", "--out=a.py", "-m", "pkg.train", "run.sh"])
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "run.sh").write_text("true\n")
    spec = parse_file(tmp_path / "job.yaml")[0]
    dirs = [tmp_path, tmp_path / "here"]
    where = f"{tmp_path} nor {tmp_path / 'here'}"
    assert scripts.missing(spec, dirs) == [f"spec.args[1]: 'train.py' is not a file in {where}"]
    assert scripts.find("run.sh", dirs) == tmp_path / "here" / "run.sh"
    assert scripts.find("/abs/run.sh", dirs) is None and scripts.find("--flag.py", dirs) is None


def test_local_finds_a_script_next_to_the_job_file_from_another_directory(tmp_path: Path) -> None:
    name = unique_name()
    jobs = tmp_path / "jobs"
    write_job(jobs / "job.yaml", name, ["train.py"])
    (jobs / "train.py").write_text("print('trained from', __file__)\n")
    done = ddpjob(tmp_path, "local", "jobs/job.yaml", "--workdir", str(tmp_path / "runs"))
    assert done.returncode == 0, done.stdout + done.stderr
    log = next((tmp_path / "runs" / name).rglob(f"{name}-1-0.log")).read_text()
    assert f"trained from {jobs / 'train.py'}" in log, log


def test_local_refuses_a_missing_script_before_any_pod_starts_and_validate_warns(tmp_path: Path) -> None:
    name = unique_name()
    write_job(tmp_path / "jobs" / "job.yaml", name, ["trian.py"])
    done = ddpjob(tmp_path, "local", "jobs/job.yaml", "--workdir", str(tmp_path / "runs"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"spec.args[0]: 'trian.py' is not a file in {tmp_path} nor {tmp_path / 'jobs'}" in done.stderr
    assert not (tmp_path / "runs" / name).exists()  # nothing started, nothing written
    checked = ddpjob(tmp_path, "validate", "jobs/job.yaml")
    assert checked.returncode == 0, checked.stderr  # valid for a cluster: the script may be in the image
    assert "warning: spec.args[0]: 'trian.py' is not a file in" in checked.stderr
    assert "(in a cluster it must be in the image)" in checked.stderr


def test_a_shell_command_string_is_not_a_script_path(tmp_path: Path) -> None:
    """``bash -c "cd src && exec torchrun train.py"``: the argument of ``-c`` (or any argument with spaces)
    is run as written, never looked up as a file; a plain missing script still is."""
    args = ["cd src && exec torchrun train.py", "absent.py"]
    spec = parse(job("shell", nodes=1, procsPerNode=1, command=["bash", "-c"], args=args))
    assert scripts.missing(spec, [tmp_path]) == [f"spec.args[1]: 'absent.py' is not a file in {tmp_path}"]
    python_c = dataclasses.replace(spec, command=("python", "-c"), args=("import x.py",))
    assert scripts.missing(python_c, [tmp_path]) == []
    assert not scripts.is_path("a b.py") and scripts.is_path("train.py")


def test_local_runs_a_bash_c_command_as_written_to_succeeded_verified(tmp_path: Path) -> None:
    """The form the issue found refused: ``command: [bash, -c]``, ``args: ["cd DIR && exec torchrun
    train.py"]`` (a DDP script run from its own folder); it trains, and the sync hook verifies it."""
    name = unique_name()
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(
        "import torch, torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "dist.init_process_group('gloo')\n"
        "torch.manual_seed(0)\n"
        "model = DDP(torch.nn.Linear(4, 2))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(20):\n"
        "    opt.zero_grad(); model(torch.randn(8, 4)).sum().backward(); opt.step()\n"
        "dist.destroy_process_group()\n"
        "import os\n"
        "if os.environ['RANK'] == '0':  # two ranks printing to one stream interleave, as under torchrun\n"
        "    print(f'trained in {os.getcwd()}')\n"
    )
    command = {"command": ["bash", "-c"], "args": [f"cd {src} && exec torchrun train.py"]}
    doc = job(name, nodes=1, procsPerNode=2, syncCheck={"everySteps": 5}, **command)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    done = ddpjob(tmp_path, "local", "job.yaml", "--workdir", str(tmp_path / "runs"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"ddpjob local: {name}: Succeeded" in done.stdout, done.stdout
    assert "replicas verified bit-identical" in done.stdout, done.stdout
    assert f"trained in {src}" in done.stdout, done.stdout


NANOGPT = Path(__file__).parents[2] / "public" / "nanogpt"


def test_nanogpt_run_from_its_folder_as_its_readme_says_ends_verified(tmp_path: Path) -> None:
    """karpathy/nanoGPT's ``train.py`` reads ``configurator.py``, ``config/`` and ``data/`` relative to where
    it is launched: under `ddpjob local`, started in its folder, the commands run there (as torchrun's would)
    and it trains to Succeeded, verified, on two pods that share the folder. The script is nanoGPT's own
    (tests/public/README.md: two lines patched for a machine without GPUs); the data is prepared by its own
    ``prepare.py`` from an ``input.txt`` written here (no network)."""
    src = tmp_path / "nanoGPT"
    shutil.copytree(NANOGPT, src)
    text = (NANOGPT / "model.py").read_text() * 4  # ~60k characters of text: enough for a char model
    (src / "data" / "shakespeare_char" / "input.txt").write_text(text)
    prepared = subprocess.run(
        [sys.executable, "data/shakespeare_char/prepare.py"],
        cwd=src,
        capture_output=True,
        text=True,
        check=False,
    )
    assert prepared.returncode == 0, prepared.stderr
    name = unique_name()
    small = "--n_layer=2 --n_head=2 --n_embd=32 --block_size=32 --batch_size=4 --dropout=0.0"
    quick = "--max_iters=12 --lr_decay_iters=12 --warmup_iters=2 --eval_interval=6 --eval_iters=2"
    cpu = "--device=cpu --backend=gloo --compile=False --dtype=float32 --gradient_accumulation_steps=2"
    args = ["train.py", "config/train_shakespeare_char.py", *small.split(), *quick.split(), *cpu.split()]
    doc = job(name, nodes=2, procsPerNode=1, command=["torchrun"], args=args, syncCheck={"everySteps": 4})
    code, out = run_local(src, [doc], workdir=str(tmp_path / "runs"), timeout=300)
    assert code == 0, out
    assert f"ddpjob local: {name}: Succeeded" in out, out
    assert "sync: replicas verified bit-identical" in out and "across 2 ranks" in out, out
    assert (src / "out-shakespeare-char" / "ckpt.pt").is_file(), "rank 0 saves into the folder it ran in"
    assert not list((tmp_path / "runs").rglob("ckpt.pt")), "nothing lands in the pods' own folders"
