"""The compute probe (ddp_trainer.sync.probe): the verdict's pure rules, one rank's digest, the SDC drill; and
across 2 nodes x 2 processes (gloo), the drill that the replica check misses and the probe names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from ddp_trainer import contract
from ddp_trainer.core.config import parse_chaos, read_pod_env
from ddp_trainer.sync import corruption_drill, probe
from ddp_trainer.sync.health import SyncHealth, SyncHealthError
from ddp_trainer.sync.settings import DEFAULT_PROBE_EVERY, SyncConfig
from helpers.torchrun_helpers import HERE, launch

A, B, C = 11, 22, 33
CPU = [7, 7, 7, 7]


def test_agreeing_ranks_need_no_repeat() -> None:
    assert probe.verdict([A, A, A, A], CPU).kind == "agree"


def test_the_odd_rank_out_of_a_reproducible_majority_is_faulty() -> None:
    found = probe.verdict([A, A, A, B], CPU, [A, A, A, B])
    assert (found.kind, found.ranks) == ("faulty", (3,))
    assert probe.verdict([A, B, A], [7, 7, 7], [A, B, A]).ranks == (1,)


@pytest.mark.parametrize(
    ("first", "second", "why"),
    [
        ([A, B], [A, B], "no majority: the ranks split 1-1"),
        ([A, A, B, B], [A, A, B, B], "split 2-2"),
        ([A, B, C, A], [A, B, C, A], "split 2-1-1"),
    ],
)
def test_without_a_strict_majority_nobody_is_accused(first: list[int], second: list[int], why: str) -> None:
    found = probe.verdict(first, [7] * len(first), second)
    assert (found.kind, found.ranks) == ("undecidable", ())
    assert why in found.why


def test_mixed_hardware_is_undecidable_before_any_repeat() -> None:
    found = probe.verdict([A, A, A, B], [7, 7, 7, 8])  # no `second`: it is not even needed
    assert (found.kind, found.ranks) == ("undecidable", ())
    assert "2 kinds of hardware" in found.why


def test_a_rank_that_disagrees_with_itself_is_flaky_not_faulty() -> None:
    found = probe.verdict([A, A, A, B], CPU, [A, A, A, C])
    assert (found.kind, found.ranks) == ("flaky", (3,))
    with pytest.raises(ValueError, match="repeat the probe"):
        probe.verdict([A, A, A, B], CPU)


@pytest.mark.parametrize(
    ("first", "second"),
    [([A, B], [A, C]), ([A, B, A, A], [B, A, C, A]), ([A, B, A, B], [C, C, A, A]), ([A, B, C], [B, C, A])],
)
def test_when_half_the_ranks_or_more_do_not_reproduce_nobody_is_named(
    first: list[int], second: list[int]
) -> None:
    found = probe.verdict(first, [7] * len(first), second)
    assert (found.kind, found.ranks) == ("undecidable", ()), found
    assert found.why.startswith(probe.NOT_REPRODUCIBLE), found.why


def test_a_pass_that_cannot_run_deterministically_is_undecidable_naming_the_op() -> None:
    errors = ["", "scatter_add_cuda_kernel does not have a deterministic implementation", "", ""]
    found = probe.verdict([A, 0, A, A], CPU, errors=errors)
    assert (found.kind, found.ranks) == ("undecidable", ())
    assert "on rank 1: scatter_add_cuda_kernel does not have a deterministic implementation" in found.why


def test_due_and_settings() -> None:
    assert [s for s in range(0, 9) if probe.due(s, 4)] == [4, 8]
    assert not any(probe.due(s, 0) for s in range(10))
    assert SyncConfig.from_env({}).probe_every == DEFAULT_PROBE_EVERY == 1000
    env = {contract.PROBE_EVERY_ENV: "0", contract.ON_FAULTY_RANK_ENV: "Warn"}
    assert SyncConfig.from_env(env).probe_every == 0 and SyncConfig.from_env(env).on_faulty_rank == "Warn"
    given = SyncConfig.from_env(env, probe_every=50, on_faulty_rank="Fail")
    assert (given.probe_every, given.on_faulty_rank) == (50, "Fail")
    with pytest.raises(
        SyncHealthError, match="DDPJOB_PROBE_EVERY='x': expected a whole number of steps, 0 for off"
    ):
        SyncConfig.from_env({contract.PROBE_EVERY_ENV: "x"})
    with pytest.raises(SyncHealthError, match="on_faulty_rank='Repair': expected one of Fail, Warn"):
        SyncConfig.from_env({}, on_faulty_rank="Repair")


def test_the_sdc_drill_is_parsed_beside_the_divergence_drill() -> None:
    pod = read_pod_env({contract.CHAOS_SDC_ENV: "rank=3,step=5", contract.NODE_NAME_ENV: "n1"})
    assert (pod.sdc, pod.chaos, pod.node) == (parse_chaos("rank=3,step=5"), None, "n1")
    with pytest.raises(ValueError, match="DDPJOB_CHAOS_SDC='3': expected"):
        read_pod_env({contract.CHAOS_SDC_ENV: "3"})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_flip_bit_changes_one_bit_of_one_element(dtype: torch.dtype) -> None:
    x = torch.linspace(1, 2, 6, dtype=dtype)
    y = corruption_drill.flip_bit(x)
    assert torch.equal(x[1:], y[1:]) and x[0] != y[0] and torch.isfinite(y).all()
    assert corruption_drill.corrupt(x)[0] == y[0]


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 1))


def test_a_probe_reproduces_itself_and_leaves_training_untouched(single_rank: Path) -> None:
    model = net()
    model(torch.randn(5, 4)).sum().backward()  # training gradients the probe must not touch
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    buffers = [b.clone() for b in model.buffers()]
    prober = probe.Probe(model, group=None, batch=torch.randn(5, 4))
    rng = torch.get_rng_state()
    first, second = prober.digest(), prober.digest()
    assert first == second  # deterministic: eval mode, no dropout, same batch
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters(), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(buffers, model.buffers(), strict=True))
    assert torch.equal(rng, torch.get_rng_state()) and model.training
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] += 1e-6
    assert prober.digest() != first  # it sees one changed parameter element


def test_the_probe_batch_is_the_first_input_the_model_sees(single_rank: Path) -> None:
    model = net()
    prober = probe.Probe(model, group=None)
    first = torch.randn(5, 4)
    model(first)
    model(torch.randn(5, 4))  # later inputs do not replace it
    result = prober.run(1)
    assert result.verdict.kind == "agree"
    assert torch.equal(prober.batch[0][0], first)


def test_the_drill_corrupts_the_probe_on_its_rank_only_from_its_step(single_rank: Path) -> None:
    model = net()
    step = [0]
    prober = probe.Probe(model, group=None, batch=torch.randn(5, 4))
    clean = prober.digest()
    corruption_drill.install_sdc_drill(model, lambda: step[0] >= 3)
    assert prober.digest() == clean
    step[0] = 3
    assert prober.digest() != clean


class NoDeterministicKernel(nn.Module):
    """A layer whose kernel has no deterministic implementation: under deterministic algorithms it raises
    what torch's own kernels raise (CUDA's scatter_add, index_put with accumulate, ...), word for word."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            torch.are_deterministic_algorithms_enabled()
            and not torch.is_deterministic_algorithms_warn_only_enabled()
        ):
            raise RuntimeError(
                "my_fused_attention_backward does not have a deterministic implementation, but you set "
                "'torch.use_deterministic_algorithms(True)'. You can turn off determinism just for this "
                "operation, or you can use the 'warn_only=True' option, if that's acceptable for your "
                "application."
            )
        return x


def test_an_op_without_a_deterministic_kernel_makes_the_probe_undecidable_and_training_goes_on(
    single_rank: Path,
) -> None:
    model = nn.Sequential(nn.Linear(4, 4), NoDeterministicKernel(), nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with SyncHealth(model, optimizer, total_steps=4, every=2, probe_every=2, on_faulty_rank="Fail") as health:
        assert health.prober is not None
        for _ in range(4):
            loss = model(torch.randn(3, 4)).square().mean()  # outside the probe: no alert, training runs
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            health.step(loss)
        found = health.prober.run(5)
    assert (found.verdict.kind, found.verdict.ranks) == ("undecidable", ())
    assert "my_fused_attention_backward does not have a deterministic implementation" in found.verdict.why
    assert health.probes == 2 and health.last_report is not None
    assert health.last_report["reason"] == "AllChecksPassed"


def test_synchealth_refuses_bad_probe_settings(single_rank: Path) -> None:
    with pytest.raises(SyncHealthError, match="probe_every=-1: expected a whole number of steps"):
        SyncHealth(nn.Linear(2, 1), probe_every=-1)


def test_a_hand_written_loop_is_probed_at_its_interval(single_rank: Path) -> None:
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with SyncHealth(model, optimizer, total_steps=6, every=5, probe_every=2) as health:
        for _ in range(6):
            loss = model(torch.randn(3, 4)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            health.step(loss)
    assert health.probes == 3 and health.last_report is not None
    assert health.last_report["probes"] == 3 and health.last_report["reason"] == "AllChecksPassed"
    assert health.checks == 5  # initial, steps 2, 4, 5 (periodic) and 6 (final): the probe needs a check


def drill(tmp_path: Path, scenario: str, extra: dict[str, str]) -> list[dict[str, object]]:
    per_node = [{contract.NODE_NAME_ENV: f"node-{k}", "HOSTNAME": f"pod-{k}"} for k in range(2)]
    run = launch(
        tmp_path, [str(HERE / "probe_scenarios.py"), scenario, str(tmp_path)], env=extra, per_node=per_node
    )
    codes = run.wait(180)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    for r in results:
        r["codes"] = codes
    assert all("error" not in r for r in results), (results, run.logs())
    return results


@pytest.mark.slow
def test_the_replica_check_misses_the_sdc_drill_and_the_probe_names_rank_and_node(tmp_path: Path) -> None:
    results = drill(tmp_path, "sdc", {contract.CHAOS_SDC_ENV: "rank=3,step=3"})
    for r in results:
        # every check passed (DDP averaged the corrupted gradient into every replica) ...
        assert r["checks_ok"] == r["checks"] > 2, r
        # ... the probes before the drill agreed, and the first one after it named rank 3 on node-1
        assert r["verdicts"][0] == ["agree", [], [], []], r
        assert ["faulty", [3], ["pod-1"], ["node-1"]] in r["verdicts"], r
    assert results[0]["report"]["reason"] == "AllChecksPassed"  # Warn: counted, and training went on
    assert results[0]["report"]["verified"] is True


@pytest.mark.slow
def test_a_model_that_does_not_reproduce_itself_names_nobody_and_trains_on_verified(tmp_path: Path) -> None:
    results = drill(tmp_path, "noisy", {})
    for r in results:
        assert r["verdicts"] and {v[0] for v in r["verdicts"]} == {"undecidable"}, r
        assert all(v[1] == [] for v in r["verdicts"]), r  # nobody named, not even as flaky
        assert r["checks_ok"] == r["checks"] > 2, r
        assert r["why"][0].startswith("the model's computation does not reproduce itself"), r
    report = results[0]["report"]
    assert (report["reason"], report["verified"]) == ("AllChecksPassed", True), report
    assert report["probeVerdict"] == "undecidable" and "does not reproduce itself" in report["probeWhy"]


@pytest.mark.slow
def test_clean_runs_never_accuse_anyone(tmp_path: Path) -> None:
    results = drill(tmp_path, "clean", {})
    for r in results:
        assert len(r["verdicts"]) >= 40 and {v[0] for v in r["verdicts"]} == {"agree"}, r


@pytest.mark.slow
def test_the_reference_trainer_fails_the_attempt_naming_rank_and_node(tmp_path: Path) -> None:
    per_node = [{contract.NODE_NAME_ENV: f"node-{k}", "HOSTNAME": f"pod-{k}"} for k in range(2)]
    target = [
        "--module",
        "ddp_trainer",
        "--device=cpu",
        "--steps=12",
        "--sync-every=4",
        "--timeout-seconds=60",
    ]
    env = {contract.CHAOS_SDC_ENV: "rank=2,step=5", contract.PROBE_EVERY_ENV: "4"}
    run = launch(tmp_path, [*target, f"--checkpoint-dir={tmp_path / 'ckpt'}"], env=env, per_node=per_node)
    assert run.wait(120) == [1, 1], run.logs()  # torchrun collapses the ranks' 87 into 1: the report says it
    report = run.report(0)
    assert (report["result"], report["reason"]) == ("Failed", contract.FAULTY_RANK), report
    assert (report["faultyRanks"], report["faultyNodes"], report["faultyPods"], report["faultyDevices"]) == (
        [2],
        ["node-1"],
        ["pod-1"],
        ["cpu"],  # what the node's taint names (a GPU's UUID on a GPU: device_id)
    )
    assert report["verified"] is True and report["mismatches"] == 0  # the replica check saw nothing wrong
    assert report["step"] == 8 and report["probes"] == 2  # step 4 agreed; step 8 (after the drill) named it
