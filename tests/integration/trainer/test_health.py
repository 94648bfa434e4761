"""SyncHealth (ddp_trainer.sync.health): its settings and bad input on one process, and real ranks (torchrun,
gloo) for what only several ranks show: a model that differs between ranks, ranks that disagree on the
number of steps, a repair."""

from __future__ import annotations

import json
import re
import urllib.request
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ddp_trainer import contract
from ddp_trainer.sync import SyncConfig, checking, health
from ddp_trainer.sync.health import SyncHealth, SyncHealthError
from helpers.torchrun_helpers import HERE, launch


def test_settings_come_from_the_arguments_then_the_ddpjob_environment_then_the_defaults() -> None:
    env = {
        contract.SYNC_EVERY_ENV: "7",
        contract.ON_DIVERGENCE_ENV: "Warn",
        contract.PROBE_EVERY_ENV: "0",
        contract.ON_FAULTY_RANK_ENV: "Warn",
    }

    def chosen(config: SyncConfig) -> tuple[int, str, int, str]:
        return config.every, config.on_divergence, config.probe_every, config.on_faulty_rank

    assert SyncConfig.from_env({}) == SyncConfig() and chosen(SyncConfig()) == (100, "Fail", 1000, "Fail")
    assert chosen(SyncConfig.from_env(env)) == (7, "Warn", 0, "Warn")
    given = SyncConfig.from_env(env, every=3, on_divergence="Repair", probe_every=50, on_faulty_rank="Fail")
    assert chosen(given) == (3, "Repair", 50, "Fail")
    assert chosen(SyncConfig.from_env(env, every=None, probe_every=None)) == (
        7,
        "Warn",
        0,
        "Warn",
    )  # not given
    assert SyncConfig.from_env({}, total_steps=9, peer_timeout=5, write_report=None) == SyncConfig(
        total_steps=9, peer_timeout=5.0
    )
    assert SyncHealth.Config is SyncConfig


def test_from_env_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(contract.SYNC_EVERY_ENV, " 12 ")
    assert SyncConfig.from_env().every == 12 and SyncConfig().every == 100  # the constructor reads nothing


@pytest.mark.parametrize(
    ("env", "settings", "message"),
    [
        ({}, {"every": 0}, "every=0: expected a whole number of steps, at least 1"),
        ({contract.SYNC_EVERY_ENV: "0"}, {}, "DDPJOB_SYNC_EVERY=0: expected a whole number"),
        ({contract.SYNC_EVERY_ENV: "ten"}, {}, "DDPJOB_SYNC_EVERY='ten': expected a whole number"),
        ({}, {"on_divergence": "Ignore"}, "on_divergence='Ignore': expected one of Fail, Repair, Warn"),
        ({contract.ON_DIVERGENCE_ENV: "fail"}, {}, "DDPJOB_ON_DIVERGENCE='fail': expected one of"),
        (
            {contract.PROBE_EVERY_ENV: "x"},
            {},
            "DDPJOB_PROBE_EVERY='x': expected a whole number of steps, 0 for off",
        ),
        ({}, {"on_faulty_rank": "Repair"}, "on_faulty_rank='Repair': expected one of Fail, Warn"),
        ({}, {"total_steps": 0}, "total_steps=0: expected a positive number of steps, or None"),
        ({contract.SYNC_EVERY_ENV: "0"}, {"every": 5}, None),  # the argument wins: the variable is not read
    ],
)
def test_bad_settings_name_the_value_and_what_is_accepted(
    env: dict[str, str], settings: dict[str, Any], message: str | None
) -> None:
    if message is None:
        assert SyncConfig.from_env(env, **settings).every == 5
        return
    with pytest.raises(SyncHealthError, match=re.escape(message)):
        SyncConfig.from_env(env, **settings)


def test_a_config_built_directly_is_checked_too() -> None:
    with pytest.raises(
        SyncHealthError, match=re.escape("every=0: expected a whole number of steps, at least 1")
    ):
        SyncConfig(every=0)
    with pytest.raises(SyncHealthError, match=re.escape("probe_every=-1: expected a whole number of steps")):
        SyncConfig().replace(probe_every=-1)
    assert SyncConfig(every=5).replace(every=None, total_steps=3) == SyncConfig(every=5, total_steps=3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'evry'"):
        SyncConfig.from_env({}, evry=5)
    with pytest.raises(TypeError, match="unexpected keyword argument 'evry'"):
        SyncConfig().replace(evry=5)


def test_old_torch_versions_are_refused() -> None:
    assert health.torch_version_ok("2.4.0") and health.torch_version_ok("2.15.0+cu132")
    assert not health.torch_version_ok("2.3.1") and not health.torch_version_ok("1.13.0")


def test_disagreement_names_the_cause() -> None:
    named = [("w", torch.zeros(3))]
    same = checking.header(5, named).tolist()
    assert checking.disagreement(same, same[::2], 0) is None
    steps = [12, -10, *same[2:]]  # ranks at steps 10 to 12
    assert "different steps (from 10 to 12; rank 1 is at 10)" in str(checking.disagreement(steps, [10], 1))
    counts = [*same[:2], 3, -2, *same[4:]]
    assert "different numbers of tensors (from 2 to 3" in str(checking.disagreement(counts, [5, 2], 0))


def test_bad_input_leaves_training_as_it_was(single_rank: Path) -> None:
    net = nn.Linear(2, 2)
    before = [p.detach().clone() for p in net.parameters()]
    with pytest.raises(SyncHealthError, match="every=0: expected a whole number of steps, at least 1"):
        SyncHealth(net, every=0)
    with pytest.raises(SyncHealthError, match=re.escape("model: expected a torch.nn.Module")):
        SyncHealth("model")  # type: ignore[arg-type]
    with pytest.raises(SyncHealthError, match="total_steps=0: expected a positive number of steps"):
        SyncHealth(net, total_steps=0)
    with pytest.raises(
        TypeError, match=re.escape("SyncHealth.__init__() got an unexpected keyword argument")
    ):
        SyncHealth(net, evry=5)
    with pytest.raises(SyncHealthError, match=re.escape("config: expected a SyncHealth.Config or None")):
        SyncHealth(net, None, {"every": 5})  # type: ignore[arg-type]
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    assert not single_rank.exists()


def test_a_hand_written_loop_gets_checks_and_a_report(single_rank: Path) -> None:
    net = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    with SyncHealth(net, optimizer, total_steps=6, every=4) as sh:
        for _ in range(6):
            net(torch.ones(1, 2)).sum().backward()
            optimizer.step()
            sh.step(0.5, samples=1)
        assert sh.checks == 3  # initial, step 4, step 6 (the last)
    report: dict[str, Any] = json.loads(single_rank.read_text())
    assert (report["result"], report["reason"], report["checks"], report["step"]) == (
        "Succeeded",
        "AllChecksPassed",
        3,
        6,
    )
    assert report["resumedFromStep"] == 0


def test_a_resumed_loop_reports_the_step_it_resumed_from(single_rank: Path) -> None:
    """The operator's sync line says "since this world resumed at step N" from it (an elastic world)."""
    net = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    with SyncHealth(net, optimizer, total_steps=12, every=4, start_step=8) as sh:
        for _ in range(4):
            sh.step()
    report: dict[str, Any] = json.loads(single_rank.read_text())
    assert (report["resumedFromStep"], report["step"], report["checks"]) == (8, 12, 2)


def test_one_config_or_keywords_give_the_same_run(single_rank: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One config is the spelling (docs/your-code.md's, no warning); the settings as keywords, the spelling
    before, still give the same run, with a DeprecationWarning that names the config saying the same."""
    monkeypatch.setenv(contract.SYNC_EVERY_ENV, "3")
    net = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        by_config = SyncHealth(
            net, optimizer, SyncHealth.Config.from_env(total_steps=6, write_report=False, probe_every=0)
        )
    assert not [
        w for w in said if issubclass(w.category, DeprecationWarning) and "SyncHealth" in str(w.message)
    ]
    assert by_config.config == SyncConfig(every=3, total_steps=6, write_report=False, probe_every=0)
    by_config.close()
    new = (
        "SyncHealth(model, optimizer, SyncHealth.Config.from_env(probe_every=..., total_steps=..., "
        "write_report=...))"
    )
    with pytest.warns(DeprecationWarning, match=re.escape(new)) as old:
        by_keywords = SyncHealth(net, optimizer, total_steps=6, write_report=False, probe_every=0)
    assert [w.filename for w in old if issubclass(w.category, DeprecationWarning)] == [
        __file__
    ]  # the caller's line
    assert by_keywords.config == by_config.config
    by_keywords.close()
    config = SyncHealth.Config(every=4, total_steps=5, write_report=False, probe_every=0)  # no environment
    with pytest.warns(DeprecationWarning, match=re.escape("config.replace(total_steps=...)")):
        sh = SyncHealth(net, optimizer, config, total_steps=6)  # a keyword replaces the config's value
    with sh:
        assert (sh.config, sh.every, sh.total_steps) == (config.replace(total_steps=6), 4, 6)
        for _ in range(6):
            sh.step()
        assert sh.checks == 3  # initial, step 4, step 6 (the last)
    with SyncHealth(net, optimizer, config.replace(total_steps=6)) as again:  # the new spelling of the same
        assert (again.config, again.every, again.total_steps) == (sh.config, 4, 6)


def test_a_compiled_model_in_ddp_is_named_by_its_own_class(single_rank: Path) -> None:
    """nanoGPT's order, ``DDP(torch.compile(model))``: the ``model`` label names the user's class, not
    ``OptimizedModule`` (the compile is lazy: nothing is compiled here)."""

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Linear(2, 1)

    wrapped = nn.parallel.DistributedDataParallel(torch.compile(GPT()))
    assert type(wrapped.module).__name__ == "OptimizedModule"
    with SyncHealth(wrapped, None, total_steps=1) as sh:
        assert sh.metrics.info["model"] == "GPT"
        sh.step()


def test_an_exception_writes_the_report_and_propagates(single_rank: Path) -> None:
    with pytest.raises(ZeroDivisionError), SyncHealth(nn.Linear(2, 1), every=2) as sh:
        sh.step()
        raise ZeroDivisionError("in the user's loop")
    report: dict[str, Any] = json.loads(single_rank.read_text())
    assert (report["result"], report["reason"]) == ("Failed", "CommandError")  # the user's code, not ours
    assert report["message"] == "ZeroDivisionError: in the user's loop" and report["checks"] == 1


def test_not_initialized_is_a_clear_error() -> None:
    assert not dist.is_initialized()
    with pytest.raises(SyncHealthError, match=re.escape("torch.distributed is not initialized")):
        SyncHealth(nn.Linear(2, 1))


def scenario(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    run = launch(tmp_path, [str(HERE / "health_scenarios.py"), name, str(tmp_path)], nnodes=1, nproc=2)
    run.wait(180)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_a_model_that_differs_between_ranks_is_refused_on_every_rank(tmp_path: Path) -> None:
    for result in scenario(tmp_path, "other_model"):
        assert not result["ok"]
        assert "different numbers of tensors" not in result["error"]  # same count, other shapes
        assert "models whose tensor names, shapes and dtypes differ" in result["error"], result


@pytest.mark.slow
def test_ranks_that_disagree_on_steps_fail_within_seconds(tmp_path: Path) -> None:
    first, second = scenario(tmp_path, "more_steps")
    # Rank 0 ends at step 12 and its final check waits for rank 1, which is in its 13th step: the check
    # fails after the 5 s peer timeout (not the job's 30 min) and says why; rank 1's step then fails as
    # rank 0 leaves.
    assert not first["ok"] and first["seconds"] < 60, first
    assert "at step 12 on rank 0 was not joined by the other ranks" in first["error"], first
    assert "took a different number of steps" in first["error"], first
    assert not second["ok"] and second["seconds"] < 90, second


@pytest.mark.slow
def test_repair_rebroadcasts_and_ends_verified(tmp_path: Path) -> None:
    first, _ = scenario(tmp_path, "repair")
    assert first["ok"], first
    report = first["report"]
    assert (report["result"], report["reason"], report["mismatches"], report["repairs"]) == (
        "Succeeded",
        "RepairedDivergence",
        1,
        1,
    )


@pytest.mark.slow
def test_hsdp_in_a_scripts_own_loop_repairs_a_replica_from_its_own_group(tmp_path: Path) -> None:
    """SyncHealth over an FSDP2 model on a 2 x 2 mesh (4 ranks, gloo): rank 3 (replica 1 of shard 1) drifts,
    the check names it with its replica group and shard, Repair re-broadcasts from rank 1 (replica 0 of
    that shard, not rank 0, which holds another shard), and the run ends verified with each shard equal
    across its replicas."""
    run = launch(
        tmp_path, [str(HERE / "health_scenarios.py"), "hsdp_repair", str(tmp_path)], nnodes=1, nproc=4
    )
    run.wait(180)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert all(r["ok"] for r in results), results
    report = results[0]["report"]
    assert (report["result"], report["reason"], report["mismatches"], report["repairs"]) == (
        "Succeeded",
        "RepairedDivergence",
        1,
        1,
    ), report
    assert report["divergedRanks"] == [3] and report["mismatchedTensors"] == ["0.weight (shard 1)"], report
    assert report["sharding"] == "HSDP 2 x 2: each of 2 shards compared across its 2 replicas", report
    assert results[0]["digest"] == results[2]["digest"] and results[1]["digest"] == results[3]["digest"]
    assert results[0]["digest"] != results[1]["digest"], "the two shards hold different parameters"
    logs = run.logs()
    assert "rank 3 (replica 1 of shard 1, replica group [1, 3]) differs from rank 1 (replica 0)" in logs, logs


@pytest.mark.slow
def test_fsdp_over_one_mesh_dimension_is_refused_naming_fsdp(tmp_path: Path) -> None:
    run = launch(tmp_path, [str(HERE / "health_scenarios.py"), "fsdp", str(tmp_path)], nnodes=1, nproc=4)
    run.wait(180)
    for r in range(4):
        result = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert not result["ok"] and "SyncHealthError: FSDP shards every parameter" in result["error"], result
        assert "no two ranks hold the same parameters" in result["error"], result


def test_an_old_framework_is_refused_naming_the_version_needed() -> None:
    from ddp_trainer.integrations import require, version_tuple

    assert version_tuple("4.57.0.dev0") == (4, 57) and version_tuple("main") > (4, 57)
    require("transformers", "4.57.1", (4, 57), "x")  # new enough: no error
    with pytest.raises(ImportError, match=re.escape("x needs lightning >= 2.4; this is lightning 2.3.3")):
        require("lightning", "2.3.3", (2, 4), "x")


def test_a_callback_without_a_process_group_stays_out_of_the_way(caplog: pytest.LogCaptureFixture) -> None:
    from ddp_trainer.integrations import distributed

    assert not dist.is_initialized()
    assert distributed() is False
    assert "no torch.distributed process group (not under torchrun?): no checks in this run" in caplog.text


def test_local_rank_0_serves_the_ddp_series(single_rank: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import values

    from helpers.torchrun_helpers import free_port

    port = free_port()
    monkeypatch.setenv(contract.METRICS_PORT_ENV, str(port))
    before = values.ValueClass
    try:
        net = nn.Linear(2, 1)
        sh = SyncHealth(net, torch.optim.SGD(net.parameters(), lr=0.1), total_steps=3, every=2)
        for _ in range(3):
            sh.step(0.25, samples=2)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        values.ValueClass = before  # the swap to multiprocess values is for this process's lifetime
    labels = 'ddpjob="",ddpjob_namespace="",node_rank="0",rank="0"'
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line[:1] != "#"
    }
    assert samples[f"ddp_step{{{labels}}}"] == 3.0 and samples[f"ddp_total_steps{{{labels}}}"] == 3.0
    assert samples[f"ddp_loss{{{labels}}}"] == 0.25 and samples[f"ddp_samples_total{{{labels}}}"] == 6.0
    checks = {k: v for k, v in samples.items() if k.startswith("ddp_sync_checks_total") and v}
    assert sorted(checks.values()) == [1.0, 1.0, 1.0], checks  # initial, periodic (2), final (3)


def test_a_bare_check_waits_for_gloo_at_exit(single_rank: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A script that calls check_in_sync with no SyncHealth ran collectives too: at exit it must wait for
    gloo's threads like SyncHealth does, or it aborts (distributed.GLOO_SETTLE_SECONDS)."""
    from ddp_trainer.sync import check_in_sync, replicas

    asked: list[bool] = []
    monkeypatch.setattr(replicas, "settle_gloo_at_exit", lambda: asked.append(True))
    assert check_in_sync(nn.Linear(2, 1)).in_sync
    assert asked == [True]
