"""``HealingSyncHealth`` where no launcher heals (one rank, gloo): the one call runs the step in the world it
gives, counts it and checks it as ``SyncHealth`` does; an error of the step is raised as it was (nothing to
heal into: the launcher restarts the workers, as before heals); bad input is refused naming what to pass.
Its heals are proven under ``ddpjob local`` (tests/integration/local/test_elastic_heal.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_trainer.sync import HealingSyncHealth, SyncConfig, SyncHealthError, World


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def test_without_a_launcher_that_heals_the_one_call_runs_and_checks_each_step(single_rank: Path) -> None:
    net = _net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    seen: list[World] = []

    def one_step(world: World) -> tuple[torch.Tensor, int]:
        seen.append(world)
        loss = world.model(torch.randn(2, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.detach(), 2

    config = SyncConfig.from_env(total_steps=6, every=3, start_step=2)
    with HealingSyncHealth(net, optimizer, config) as health:
        assert isinstance(health.model, DistributedDataParallel) and health.model.module is net
        while health.current_step < 6:
            world = health.train_step(one_step)
            assert not world.changed and world.healed is None and world.step == health.current_step
    assert [w.step for w in seen] == [2, 3, 4, 5] and {(w.rank, w.size) for w in seen} == {(0, 1)}
    report = json.loads(single_rank.read_text())
    assert (report["result"], report["step"], report["resumedFromStep"]) == ("Succeeded", 6, 2), report
    assert report["checks"] == 3, report  # the initial check, step 3's, step 6's


def test_an_error_of_the_step_is_raised_as_it_was_where_no_launcher_heals(single_rank: Path) -> None:
    net = _net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)

    def failing(world: World) -> None:
        raise RuntimeError("Connection closed by peer")  # a lost peer's, with nothing to heal into

    config = SyncConfig.from_env(total_steps=4)
    with (
        pytest.raises(RuntimeError, match="Connection closed by peer"),
        HealingSyncHealth(net, optimizer, config) as health,
    ):
        health.train_step(failing)
    assert health.current_step == 0  # the step in flight was not counted


def test_bad_input_is_refused_naming_what_to_pass(single_rank: Path) -> None:
    net = _net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(SyncHealthError, match=re.escape("pass the module, not its DistributedDataParallel")):
        HealingSyncHealth(DistributedDataParallel(net), optimizer)
    with pytest.raises(SyncHealthError, match="build a SyncHealth for a group of your own"):
        HealingSyncHealth(net, optimizer, group=None)
