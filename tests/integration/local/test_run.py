"""`ddpjob local` end to end: real torchrun, real gloo DDP, real processes killed and resumed."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from ddp_trainer import contract
from ddp_trainer.launch import warm
from helpers.local_jobs import finish_run, job, launcher_pid, processes_of, start_run, unique_name
from testcluster import processes

pytestmark = pytest.mark.slow


@pytest.fixture
def name() -> str:
    return unique_name()


def _wait_for_checkpoint(run_dir: Path, process: subprocess.Popen[str], timeout: float = 120) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted((run_dir / "volumes" / "checkpoint").glob("step-*.pt"))
        if found:
            return found[-1]
        assert process.poll() is None, "ddpjob local ended before its first checkpoint"
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint in {run_dir} after {timeout}s")


def test_killed_pod_restarts_the_gang_which_resumes(tmp_path: Path, name: str) -> None:
    process = start_run(tmp_path, job(name, trainer={"steps": 400, "batchSize": 16, "checkpointEvery": 20}))
    _wait_for_checkpoint(tmp_path / "runs" / name, process)
    os.kill(launcher_pid(name, 1), signal.SIGKILL)
    code, out = finish_run(process)
    assert code == 0, out
    assert "attempt 1 failed (node 1 was killed by SIGKILL (exit -9)); gang restart 1 of 3" in out
    assert "attempt 2: rendezvous" in out
    assert f"ddpjob local: {name}: Succeeded" in out and "after 2 attempt(s)" in out, out
    assert "replicas verified bit-identical" in out
    report = (tmp_path / "runs" / name / "attempt-2" / f"{name}-2-0.termination-log").read_text()
    assert '"resumedFromStep":0' not in report and '"resumedFromStep":' in report
    # issue 58 item 3: the summary counts attempt 1's checks too (pod 0's report: SIGTERM, it reported)
    counted = [
        yaml.safe_load(
            (tmp_path / "runs" / name / f"attempt-{n}" / f"{name}-{n}-0.termination-log").read_text()
        )
        for n in (1, 2)
    ]
    worlds = [report.get(contract.REPORT_EARLIER_WORLDS) or {} for report in counted]
    total = sum(
        report["checks"] + world.get("checks", 0) for report, world in zip(counted, worlds, strict=True)
    )
    resumed = worlds[1].get("resumedFromStep", counted[1]["resumedFromStep"])  # where attempt 2 began
    assert counted[0]["checks"] > 0, counted
    assert f"replicas verified bit-identical {total} times across 4 ranks in 2 attempts" in out, out
    assert f"(attempt 2 resumed at step {resumed}; last check at step 400)" in out, out
    assert not list(processes_of(name))


def test_killed_rank_restarts_the_gang_in_place(tmp_path: Path, name: str) -> None:
    """A worker process SIGKILLed: torchrun's agents restart every rank of both pods in the same pods
    (c10d rendezvous), the gang resumes from its checkpoint, is verified again and finishes in attempt 1."""
    process = start_run(tmp_path, job(name, trainer={"steps": 400, "batchSize": 16, "checkpointEvery": 20}))
    run_dir = tmp_path / "runs" / name
    _wait_for_checkpoint(run_dir, process)
    pods = sorted(pid for pid, _, argv in processes_of(name) if contract.LAUNCHER_MODULE in argv[:3])
    servers = [
        env
        for pid, env, argv in processes_of(name)
        if "multiprocessing.forkserver" in " ".join(argv)
        and not processes.name(pid).startswith(warm.WORKER_NAME_PREFIX)
    ]
    # one fork server per pod, started after torchrun's OMP_NUM_THREADS=1 (torch reads it when it loads:
    # four ranks of two threads each on two cores ran a step ten times slower)
    assert [env.get("OMP_NUM_THREADS") for env in servers] == ["1", "1"], servers
    (victim,) = [
        pid for pid, _, _ in processes_of(name) if processes.name(pid) == f"{warm.WORKER_NAME_PREFIX}3"
    ]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while victim in {pid for pid, _, _ in processes_of(name)} and time.monotonic() < deadline:
        time.sleep(0.05)
    # the same pod processes (launchers) run the restarted ranks
    assert sorted(pid for pid, _, argv in processes_of(name) if contract.LAUNCHER_MODULE in argv[:3]) == pods
    code, out = finish_run(process)
    assert code == 0, out
    assert f"ddpjob local: {name}: Succeeded" in out and "after 1 attempt(s)" in out, out
    assert "restarted its gang in place 1 time(s) in the same pods (last: rank 3 killed by signal 9" in out
    report = yaml.safe_load((run_dir / "attempt-1" / f"{name}-1-0.termination-log").read_text())
    assert report["restartsInPlace"] == 1 and report["resumedFromStep"] > 0, report
    assert report["verified"] is True and report["step"] == 400
    # issue 58 item 3: the world before the restart in place reported its checks; the pod's report keeps them
    earlier = report[contract.REPORT_EARLIER_WORLDS]
    assert earlier["worlds"] == 1 and earlier["checks"] > 0, report
    total = report["checks"] + earlier["checks"]
    assert (
        f"replicas verified bit-identical {total} times across 4 ranks in 2 worlds of one attempt (gang "
        "restarts in place or resizes) (last check at step 400)"
    ) in out, out
    for pod in (0, 1):  # both pods' agents restarted their workers: the whole gang, not one node
        assert (
            "[launcher] gang restart in place 1:"
            in (run_dir / "attempt-1" / f"{name}-1-{pod}.log").read_text()
        )


def test_ctrl_c_stops_everything_and_the_next_run_resumes(tmp_path: Path, name: str) -> None:
    process = start_run(tmp_path, job(name, trainer={"steps": 400, "batchSize": 16, "checkpointEvery": 20}))
    run_dir = tmp_path / "runs" / name
    _wait_for_checkpoint(run_dir, process)
    assert list(processes_of(name))
    process.send_signal(signal.SIGINT)
    code, out = finish_run(process, timeout=60)
    assert code == 130, out
    assert "interrupted during attempt 1; every pod stopped" in out
    assert not list(processes_of(name)), "orphaned processes after Ctrl-C"
    checkpoints = sorted((run_dir / "volumes" / "checkpoint").glob("step-*.pt"))
    assert checkpoints
    code, out = finish_run(
        start_run(tmp_path, job(name, trainer={"steps": 400, "batchSize": 16, "checkpointEvery": 20}))
    )
    assert code == 0, out
    assert "resuming from the checkpoint an earlier Interrupted run left" in out
    assert "attempts continue at 2" in out and (run_dir / "attempt-1" / f"{name}-1-0.log").stat().st_size
    report = yaml.safe_load((run_dir / "attempt-2" / f"{name}-2-0.termination-log").read_text())
    assert report["resumedFromStep"] > 0 and report["verified"] is True and report["step"] == 400


def test_divergence_fails_without_restart(tmp_path: Path, name: str) -> None:
    doc = job(name, env=[{"name": "DDPJOB_CHAOS_DIVERGE", "value": "rank=3,step=30"}])
    code, out = finish_run(start_run(tmp_path, doc))
    assert code == 1, out
    assert f"ddpjob local: {name}: Failed" in out and "after 1 attempt(s)" in out
    assert "SyncDivergence" in out and "replicas DIVERGED" in out
    assert "attempt 2" not in out and "in place" not in out  # 86 is never restarted, in place or not


def test_plain_torchrun_script_runs_unchanged(tmp_path: Path, name: str) -> None:
    script = tmp_path / "plain.py"
    script.write_text(
        "import os, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.ones(1) * dist.get_rank()\n"
        "dist.all_reduce(t)\n"
        "assert dist.get_world_size() == 4 and t.item() == 6, (dist.get_world_size(), t)\n"
        # one write per line: the ranks of a pod share its stdout, as in a container
        "line = f\"plain script rank {dist.get_rank()} sum {t.item()} node {os.environ['GROUP_RANK']}\\n\"\n"
        "os.write(1, line.encode())\n"
        "dist.destroy_process_group()\n"
    )
    doc = job(name, command=["torchrun"], args=[str(script)])
    code, out = finish_run(start_run(tmp_path, doc, "--verbose"))
    assert code == 0, out
    assert f"[{name}-1-1] plain script rank 2 sum 6.0 node 1" in out
    assert "sync: no DDP model was built in any rank: nothing to verify" in out  # the hook saw none


def test_bad_spec_is_refused_before_anything_starts(tmp_path: Path, name: str) -> None:
    code, out = finish_run(start_run(tmp_path, job(name, nodes=0, device="tpu")))
    assert code == 2
    assert f"DDPJob/{name}: spec.device: Unsupported value" in out and "spec.nodes: Invalid value: 0" in out
    assert not (tmp_path / "runs").exists()


def test_cuda_job_without_gpus_is_refused(tmp_path: Path, name: str) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the refusal only happens without one")
    code, out = finish_run(start_run(tmp_path, job(name, device="cuda")))
    assert code == 2
    assert "spec.device is cuda and the job needs 4 GPUs" in out and "set device: cpu" in out
    assert not (tmp_path / "runs").exists()


def test_a_faulty_rank_found_by_the_probe_ends_the_attempt_naming_it(tmp_path: Path, name: str) -> None:
    """The SDC drill on rank 3 under ``ddpjob local`` (2 x 2): every sync check passes, the probe names rank 3
    and the attempt ends with FaultyRank (no restart left: maxRestarts 0)."""
    doc = job(
        name,
        trainer={"steps": 60, "batchSize": 16, "checkpointEvery": 0},
        syncCheck={"everySteps": 10, "probeEverySteps": 20},
        maxRestarts=0,
        env=[{"name": "DDPJOB_CHAOS_SDC", "value": "rank=3,step=25"}],
    )
    code, out = finish_run(start_run(tmp_path, doc))
    assert code == 1, out
    assert f"ddpjob local: {name}: Failed" in out and "FaultyRank" in out, out
    assert "compute probe at step 40: faulty rank 3" in out, out
    report = yaml.safe_load(
        (tmp_path / "runs" / name / "attempt-1" / f"{name}-1-0.termination-log").read_text()
    )
    assert (report["faultyRanks"], report["mismatches"], report["probes"]) == ([3], 0, 2), report
