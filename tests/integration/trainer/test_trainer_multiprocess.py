"""The trainer as a pod runs it: torchrun, 2 "nodes" x 2 processes (1 x 2 for the cheaper policy runs),
gloo on loopback. Checks the termination message, exit codes, checkpoints and live metrics."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ddp_trainer import contract
from ddp_trainer.contract import FAILURE_EXIT_CODE
from helpers.torchrun_helpers import Launch, by_rank, checkpoints, launch, scrape

pytestmark = pytest.mark.slow

TRAINER = ["--module", "ddp_trainer", "--device=cpu", "--backend=gloo", "--seed=7", "--batch-size=16"]
# The run that the clean, the killed and the resumed runs share (a slow user model: time to scrape/signal).
LONG = [*TRAINER, "--steps=40", "--sync-every=10", "--checkpoint-every=10", "--grad-accumulation=2"]
LONG += [
    "--learning-rate=0.01",
    "--model=slow_factories:slow_mlp",
    "--on-divergence=Fail",
    "--timeout-seconds=120",
]
# Fire-drill runs: rank 1 nudges a parameter after step 15; checks every 10 steps.
DRILL = [*TRAINER, "--steps=30", "--sync-every=10", "--checkpoint-every=10", "--timeout-seconds=120"]


@dataclass
class CleanRun:
    codes: list[int]
    reports: list[dict[str, Any]]
    scrapes: list[list[dict[str, list[tuple[dict[str, str], float]]]]]
    checkpoint_dir: Path
    launch: Launch


def wait_scraping(
    run: Launch, timeout: float = 180
) -> list[list[dict[str, list[tuple[dict[str, str], float]]]]]:
    """Scrape every node's metrics port while the run lasts."""
    scrapes: list[list[dict[str, list[tuple[dict[str, str], float]]]]] = [[] for _ in run.nodes]
    deadline = time.monotonic() + timeout
    while run.running() and time.monotonic() < deadline:
        for node in run.nodes:
            samples = scrape(node.metrics_port)
            if samples and by_rank(samples, "ddp_steps_total"):
                scrapes[node.rank].append(samples)
        time.sleep(0.1)
    return scrapes


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> CleanRun:
    work = tmp_path_factory.mktemp("clean")
    run = launch(work, [*LONG, f"--checkpoint-dir={work / 'ckpt'}"])
    scrapes = wait_scraping(run)
    codes = run.wait(60)
    return CleanRun(codes, [run.report(0), run.report(1)], scrapes, work / "ckpt", run)


def test_clean_run_is_verified(clean: CleanRun) -> None:
    assert clean.codes == [0, 0], clean.launch.logs()
    report = clean.reports[0]
    assert report["result"] == "Succeeded" and report["reason"] == "AllChecksPassed"
    assert report["verified"] is True
    # initial + steps 10, 20, 30, 40
    assert (report["checks"], report["mismatches"], report["repairs"]) == (5, 0, 0)
    assert (report["lastCheckStep"], report["step"], report["worldSize"]) == (40, 40, 4)
    mine, theirs = (dict(r) for r in clean.reports)
    writers = (mine.pop(contract.REPORT_WRITER), theirs.pop(contract.REPORT_WRITER))
    assert writers[0] != writers[1], writers  # each pod's report says which of its processes wrote it
    assert theirs == mine  # and node 1's local rank 0 reports the same as node 0's otherwise
    assert checkpoints(clean.checkpoint_dir) == [
        "step-00000030.testjob.pt",
        "step-00000040.testjob.pt",
    ]  # the newest two


def test_metrics_show_every_local_rank_with_live_values(clean: CleanRun) -> None:
    for node, expected_ranks in ((0, {"0", "1"}), (1, {"2", "3"})):
        scrapes = clean.scrapes[node]
        assert len(scrapes) >= 2, f"node {node}: {len(scrapes)} scrapes while training\n{clean.launch.logs()}"
        first, last = by_rank(scrapes[0], "ddp_steps_total"), by_rank(scrapes[-1], "ddp_steps_total")
        assert set(last) == expected_ranks  # one port per pod shows all its local ranks
        assert all(0 < last[r] <= 40 for r in expected_ranks)
        assert sum(last.values()) > sum(first.get(r, 0.0) for r in expected_ranks), "steps did not advance"
        labels = [lab for lab, _ in scrapes[-1]["ddp_steps_total"]]
        assert {(lab["ddpjob"], lab["ddpjob_namespace"], lab["node_rank"]) for lab in labels} == {
            ("testjob", "testns", str(node))
        }
        info = scrapes[-1]["ddp_info"]
        assert {lab["world_size"] for lab, _ in info} == {"4"} and all(v == 1.0 for _, v in info)
        # a scrape reads each metric's file at its own moment while a rank is mid-step: one step apart at most
        samples = by_rank(scrapes[-1], "ddp_samples_total")
        assert all(abs(samples[r] - last[r] * 2 * 16) <= 2 * 16 for r in expected_ranks)  # 2 × 16 a step
        durations = by_rank(scrapes[-1], "ddp_step_duration_seconds_count")
        assert all(abs(durations[r] - last[r]) <= 1 for r in expected_ranks), (durations, last)
        assert all(math.isfinite(v) and v > 0 for v in by_rank(scrapes[-1], "ddp_loss").values())
        checks = scrapes[-1]["ddp_sync_checks_total"]
        initial = [v for lab, v in checks if lab["kind"] == "initial" and lab["result"] == "ok"]
        assert initial == [1.0, 1.0]
        # every kind and result is there from the start, and no check found a mismatch
        assert len(checks) == 2 * 4 * 2 and all(v == 0 for lab, v in checks if lab["result"] == "mismatch")
        assert set(by_rank(scrapes[-1], "ddp_sync_every_steps").values()) == {10.0}
    skews = [v for s in clean.scrapes[0] for v in by_rank(s, "ddp_step_time_skew_ratio").values()]
    assert skews and all(0 <= v <= 1 for v in skews)


def test_fail_policy_exits_86_and_keeps_the_last_good_checkpoint(tmp_path: Path) -> None:
    run = launch(
        tmp_path,
        [*DRILL, "--on-divergence=Fail", f"--checkpoint-dir={tmp_path / 'ckpt'}"],
        env={"DDPJOB_CHAOS_DIVERGE": "rank=3,step=15"},
    )
    codes = run.wait()
    assert codes == [1, 1], run.logs()  # torchrun collapses the ranks' 86 into 1 ...
    assert "exitcode  : 86" in run.logs()  # ... and lists it per rank
    report = run.report()
    assert (report["result"], report["reason"], report["verified"]) == ("Diverged", "SyncDivergence", False)
    assert (report["lastCheckStep"], report["mismatches"], report["checks"]) == (20, 1, 3)
    assert (report["mismatchedTensors"], report["divergedRanks"]) == (["net.0.weight"], [3])
    assert report["maxAbsDiff"] == pytest.approx(1e-3, rel=1e-3)
    assert checkpoints(tmp_path / "ckpt") == ["step-00000010.testjob.pt"]  # never saved after the divergence


def test_repair_policy_repairs_and_ends_verified(tmp_path: Path) -> None:
    run = launch(
        tmp_path,
        [*DRILL, "--on-divergence=Repair", f"--checkpoint-dir={tmp_path / 'ckpt'}"],
        nnodes=1,
        env={"DDPJOB_CHAOS_DIVERGE": "rank=1,step=15"},
    )
    assert run.wait() == [0], run.logs()
    report = run.report()
    assert (report["result"], report["reason"], report["verified"]) == (
        "Succeeded",
        "RepairedDivergence",
        True,
    )
    # initial, 10, 20 (mismatch) + repair check, 30
    assert (report["checks"], report["mismatches"], report["repairs"], report["step"]) == (5, 1, 1, 30)
    assert report["mismatchedTensors"] == ["net.0.weight"] and report["divergedRanks"] == [1]
    assert checkpoints(tmp_path / "ckpt") == [
        "step-00000020.testjob.pt",
        "step-00000030.testjob.pt",
    ]  # saved once repaired


def test_warn_policy_continues_unverified(tmp_path: Path) -> None:
    run = launch(
        tmp_path,
        [*DRILL, "--on-divergence=warn", f"--checkpoint-dir={tmp_path / 'ckpt'}"],
        nnodes=1,
        env={"DDPJOB_CHAOS_DIVERGE": "rank=0,step=15"},
    )
    assert run.wait() == [0], run.logs()
    report = run.report()
    assert (report["result"], report["reason"], report["verified"]) == (
        "Succeeded",
        "DivergenceIgnored",
        False,
    )
    assert (report["checks"], report["mismatches"], report["repairs"], report["step"]) == (4, 2, 0, 30)
    assert report["divergedRanks"] == [1]  # a 1:1 tie: the lowest rank's copy is the reference
    assert checkpoints(tmp_path / "ckpt") == ["step-00000010.testjob.pt"]


def test_resume_after_kill_continues_from_the_last_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    args = [*LONG, f"--checkpoint-dir={ckpt}"]
    # SIGKILL both pods (every process) mid-run, once the step-10 checkpoint exists.
    first = launch(tmp_path / "a", args)
    deadline = time.monotonic() + 120
    while (
        "step-00000010.testjob.pt" not in checkpoints(ckpt)
        and first.running()
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert first.running(), f"finished before it could be killed\n{first.logs()}"
    first.kill()
    killed_at = int(checkpoints(ckpt)[-1][5:13])
    assert 10 <= killed_at < 40
    # The restart resumes from that checkpoint, not step 0, identical on every rank, and finishes.
    # (Its final bits may differ from an uninterrupted 4-rank run's: see docs/trainer.md, "Resuming".)
    second = launch(tmp_path / "b", args)
    assert second.wait() == [0, 0], second.logs()
    final = second.report()
    assert final["resumedFromStep"] == killed_at
    assert (final["result"], final["verified"], final["step"]) == ("Succeeded", True, 40)
    assert final["checks"] == 1 + (40 - killed_at) // 10  # initial + every 10 steps after the resume


def test_sigterm_checkpoints_at_the_next_step_boundary(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    args = [*LONG, "--steps=400", "--checkpoint-every=0", f"--checkpoint-dir={ckpt}"]  # only SIGTERM saves
    run = launch(tmp_path, args, nnodes=1)
    deadline = time.monotonic() + 120
    while run.running() and time.monotonic() < deadline:
        samples = scrape(run.nodes[0].metrics_port)
        if samples and by_rank(samples, "ddp_steps_total").get("0", 0) >= 3:
            break
        time.sleep(0.05)
    run.terminate()  # the launcher only, as the kubelet does; torchrun forwards it to the ranks
    assert run.wait() != [0], run.logs()
    assert "exitcode  : 143" in run.logs() or "Interrupted" in run.logs()
    report = run.report()
    assert (report["result"], report["reason"], report["verified"]) == ("Interrupted", "Terminated", True)
    assert 3 <= report["step"] < 400
    assert report["lastCheckStep"] == report["step"]  # verified at the boundary where all ranks stopped
    assert checkpoints(ckpt) == [f"step-{report['step']:08d}.testjob.pt"]  # and checkpointed exactly there


def test_without_a_launcher_and_a_failing_factory(tmp_path: Path) -> None:
    """``python -m ddp_trainer`` alone is one rank; an error becomes a "Failed" report and exit 1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROMETHEUS_", "DDPJOB_", "RANK"))}
    env |= {"DDPJOB_METRICS_PORT": "0", "DDPJOB_TERMINATION_LOG": str(tmp_path / "report.json")}
    cmd = [sys.executable, "-m", "ddp_trainer", "--device=cpu", "--steps=5", "--sync-every=2"]
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["result"], report["verified"], report["worldSize"], report["checks"]) == (
        "Succeeded",
        True,
        1,
        4,
    )
    done = subprocess.run(
        [*cmd, "--model=no_such_module:build"], env=env, cwd=tmp_path, capture_output=True, timeout=120
    )
    assert done.returncode == FAILURE_EXIT_CODE
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["result"], report["reason"]) == ("Failed", "TrainerError")
    assert "--model='no_such_module:build'" in report["message"]
