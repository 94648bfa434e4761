"""Users' own scripts under `ddpjob local` (2 nodes × 2 processes, gloo): a Hugging Face `Trainer`, a
Lightning module and a hand-written loop, each with sync health in one line (examples/). A clean run ends
saying how often the replicas were verified; a fire drill is caught at the next check and fails the job
with the divergence exit code, the report naming the tensor and the rank."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.local_jobs import run_local, unique_name

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
STEPS = 20
# example file → the tensor the fire drill nudges (the model's first parameter, as its script names it)
SCRIPTS = {
    "hf-trainer.yaml": "transformer.wte.weight",
    "lightning.yaml": "net.0.weight",
    "plain-loop.yaml": "0.weight",
}


def example(file: str, name: str, env: dict[str, str]) -> dict[str, Any]:
    """The example DDPJob, renamed, its script path absolute (the test runs elsewhere), fewer steps."""
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / file).read_text())
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    spec["args"] = [str(EXAMPLES.parent / spec["args"][0])]
    spec["env"] = [{"name": k, "value": v} for k, v in {"STEPS": str(STEPS), **env}.items()]
    spec["syncCheck"] = {"everySteps": 5, "onDivergence": "Fail"}
    spec["maxRestarts"] = 0
    return doc


def report(tmp_path: Path, name: str) -> dict[str, Any]:
    """Node 0's termination report of attempt 1."""
    path = tmp_path / "runs" / name / "attempt-1" / f"{name}-1-0.termination-log"
    assert path.exists(), f"no report at {path}"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@pytest.mark.parametrize("file", sorted(SCRIPTS))
def test_a_clean_run_reports_its_checks(tmp_path: Path, file: str) -> None:
    name = unique_name()
    code, out = run_local(tmp_path, [example(file, name, {})], timeout=400)
    assert code == 0, out
    # initial, every 5 steps of 20 (the last is the final one)
    assert f"ddpjob local: {name}: Succeeded" in out, out
    assert "sync: replicas verified bit-identical 5 times across 4 ranks (last check at step 20)" in out, out
    rep = report(tmp_path, name)
    assert (rep["result"], rep["reason"], rep["checks"], rep["step"]) == (
        "Succeeded",
        "AllChecksPassed",
        5,
        20,
    )


@pytest.mark.parametrize("file", sorted(SCRIPTS))
def test_a_fire_drill_is_caught_at_the_next_check(tmp_path: Path, file: str) -> None:
    name = unique_name()
    code, out = run_local(
        tmp_path, [example(file, name, {"DDPJOB_CHAOS_DIVERGE": "rank=3,step=7"})], timeout=400
    )
    assert code == 1, out
    assert (
        f"ddpjob local: {name}: Failed" in out and "SyncDivergence" in out and "replicas DIVERGED" in out
    ), out
    assert "exitcode  : 86" in out, out  # the workers exit with the divergence code (torchrun says 1)
    rep = report(tmp_path, name)
    assert (rep["result"], rep["reason"], rep["lastCheckStep"]) == ("Diverged", "SyncDivergence", 10)
    assert rep["mismatchedTensors"] == [SCRIPTS[file]] and rep["divergedRanks"] == [3], rep


@pytest.mark.parametrize("file", sorted(SCRIPTS))
def test_the_compute_probe_names_a_faulty_rank_in_users_code(tmp_path: Path, file: str) -> None:
    """The SDC drill on rank 3 after step 3: every sync check passes, and the probe at step 10 (on the first
    batch rank 0's model saw, captured by SyncHealth itself) names rank 3 (FaultyRank, exit 87)."""
    name = unique_name()
    doc = example(file, name, {"DDPJOB_CHAOS_SDC": "rank=3,step=3"})
    doc["spec"]["syncCheck"]["probeEverySteps"] = 10
    code, out = run_local(tmp_path, [doc], timeout=400)
    assert code == 1 and "FaultyRank" in out and "exitcode  : 87" in out, out
    rep = report(tmp_path, name)
    assert (rep["reason"], rep["faultyRanks"], rep["mismatches"], rep["step"]) == (
        "FaultyRank",
        [3],
        0,
        10,
    ), rep


# -- no code change: the sync hook (spec.syncCheck.autoInstrument, on by default) ------------------------


def without_callback(tmp_path: Path) -> Path:
    """examples/hf_trainer.py with its one line of ddpjob (the import and the callback) taken out, and
    transformers imported before torch, as run_clm.py and most Trainer scripts begin (transformers probes
    ``importlib.util.find_spec("torch")`` first: the hook must still see torch arrive)."""
    text = (EXAMPLES / "hf_trainer.py").read_text()
    lines = (
        "from ddp_trainer.integrations.transformers import SyncHealthCallback\n",
        "callbacks=[SyncHealthCallback()],",
    )
    imports = "from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments\n"
    head = "import torch\n" + imports
    assert all(line in text for line in (*lines, head)), "the example changed: update this test"
    for line in lines:
        text = text.replace(line, "")
    text = text.replace(
        head,
        "from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments\nimport torch\n",
    )
    script = tmp_path / "hf_trainer_plain.py"
    script.write_text(text)
    return script


@pytest.mark.parametrize("file", ["no-code.yaml", "hf-trainer.yaml"])
def test_a_script_without_ddpjob_code_is_verified(tmp_path: Path, file: str) -> None:
    """The plain DDP script, and the Hugging Face Trainer script without its callback: the operator's init
    container and PYTHONPATH put the hook in, which checks and reports as the callback does."""
    name = unique_name()
    doc = example(file, name, {})
    if file == "hf-trainer.yaml":
        doc["spec"]["args"] = [str(without_callback(tmp_path))]
    code, out = run_local(tmp_path, [doc], timeout=400)
    assert code == 0, out
    assert "ddpjob sync health: checking 1 DDP model(s): " in out, out
    assert "sync: replicas verified bit-identical 5 times across 4 ranks (last check at step 20)" in out, out
    rep = report(tmp_path, name)
    assert (rep["result"], rep["reason"], rep["checks"], rep["step"]) == (
        "Succeeded",
        "AllChecksPassed",
        5,
        20,
    )


def test_a_fire_drill_in_a_script_without_ddpjob_code_is_caught(tmp_path: Path) -> None:
    name = unique_name()
    doc = example("no-code.yaml", name, {"DDPJOB_CHAOS_DIVERGE": "rank=3,step=7"})
    code, out = run_local(tmp_path, [doc], timeout=400)
    assert code == 1, out
    assert (
        f"ddpjob local: {name}: Failed" in out and "SyncDivergence" in out and "replicas DIVERGED" in out
    ), out
    rep = report(tmp_path, name)
    assert (rep["result"], rep["reason"], rep["lastCheckStep"]) == ("Diverged", "SyncDivergence", 10)
    assert rep["mismatchedTensors"] == ["0.weight"] and rep["divergedRanks"] == [3], rep


def test_a_job_that_builds_no_ddp_model_says_there_was_nothing_to_verify(tmp_path: Path) -> None:
    """2 × 2 ranks that train with a process group but no DistributedDataParallel (gradients averaged by
    hand): the job succeeds, and says no DDP model was built, not "not reported"."""
    name = unique_name()
    doc = example("no-code.yaml", name, {})
    scenarios = Path(__file__).resolve().parents[2] / "helpers" / "autoinstrument_scenarios.py"
    doc["spec"]["args"] = [str(scenarios), "no-ddp", str(tmp_path / "final.pt")]
    code, out = run_local(tmp_path, [doc], timeout=400)
    assert code == 0, out
    assert f"ddpjob local: {name}: Succeeded" in out, out
    assert "sync: no DDP model was built in any rank: nothing to verify" in out, out
    assert "not reported" not in out, out


def test_hsdp_without_ddpjob_code_is_verified_shard_by_shard_and_a_drifted_replica_named(
    tmp_path: Path,
) -> None:
    """examples/hsdp.yaml as shipped (FSDP2's fully_shard on a 2 x 2 mesh, no ddpjob code): every shard is
    compared across its replicas and the job ends verified; the fire drill on rank 3 is named with its
    shard and replica group, and fails the job."""
    name = unique_name()
    code, out = run_local(tmp_path, [example("hsdp.yaml", name, {})], timeout=400)
    assert code == 0, out
    assert "checking 1 HSDP model(s): Sequential (found at its optimizer's first step)" in out, out
    assert (
        "sync: replicas verified bit-identical 5 times across 4 ranks (last check at step 20; "
        "HSDP 2 x 2: each of 2 shards compared across its 2 replicas)"
    ) in out, out
    name = unique_name()
    doc = example("hsdp.yaml", name, {"DDPJOB_CHAOS_DIVERGE": "rank=3,step=7"})
    code, out = run_local(tmp_path, [doc], timeout=400)
    assert code == 1 and "replicas DIVERGED" in out, out
    assert "rank 3 (replica 1 of shard 1, replica group [1, 3]) differs from rank 1 (replica 0)" in out, out
    rep = report(tmp_path, name)
    assert (rep["reason"], rep["mismatchedTensors"], rep["divergedRanks"]) == (
        "SyncDivergence",
        ["0.weight (shard 1)"],
        [3],
    ), rep


def test_fsdp_over_one_mesh_dimension_says_nothing_is_replicated_naming_fsdp(tmp_path: Path) -> None:
    """The same script on a 1-D mesh (SHARDS=4: FSDP): no two ranks hold the same parameters; the job
    succeeds and says so, naming FSDP, not "no DDP model"."""
    name = unique_name()
    code, out = run_local(tmp_path, [example("hsdp.yaml", name, {"SHARDS": "4"})], timeout=400)
    assert code == 0, out
    assert "sync: FSDP shards every parameter across all ranks" in out, out
    assert "no two ranks hold the same parameters, so there is nothing to compare" in out, out
    assert "no DDP model" not in out, out
    assert report(tmp_path, name)["reason"] == "FullyShardedNoReplicas"
