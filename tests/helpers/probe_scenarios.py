"""The compute probe across real ranks (run by tests/integration/trainer/test_probe_ranks.py under
torchrun, gloo): one
scenario per run, named by argv[1]; each rank writes what it saw to ``<out>/rank<R>.json``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_trainer.sync import SyncHealth
from ddp_trainer.sync.probe import ProbeResult


class Noisy(nn.Module):
    """A layer that adds noise from a generator of its own, seeded by the process: its forward and backward
    never repeat, on any rank (as a non-deterministic GPU kernel would behave)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 16)
        self.noise = torch.Generator().manual_seed(os.getpid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x) * (1 + 1e-3 * torch.rand(16, generator=self.noise)))


def run(
    seed: int, steps: int, every: int, probe_every: int, verdicts: list[Any], noisy: bool = False
) -> SyncHealth:
    """Train a small DDP model ``steps`` steps on per-rank random data, probed every ``probe_every``."""
    torch.manual_seed(seed)
    first: nn.Module = Noisy() if noisy else nn.Sequential(nn.Linear(4, 16), nn.Tanh())
    net = DistributedDataParallel(nn.Sequential(first, nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    health = SyncHealth(
        net,
        optimizer,
        total_steps=steps,
        every=every,
        probe_every=probe_every,
        on_faulty_rank="Warn",
        write_report=dist.get_rank() == 0 and seed == 0,
    )
    assert health.prober is not None
    probe_run = health.prober.run

    def recorded(step: int) -> ProbeResult:
        found = probe_run(step)
        verdicts.append([found.verdict.kind, list(found.verdict.ranks), list(found.pods), list(found.nodes)])
        return found

    health.prober.run = recorded  # type: ignore[method-assign]
    torch.manual_seed(seed * 100 + dist.get_rank())  # per-rank data
    with health:
        for _ in range(steps):
            loss = net(torch.randn(8, 4)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            health.step(loss, samples=8)
    return health


def main() -> None:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    result: dict[str, Any] = {"verdicts": []}
    try:
        if scenario == "sdc":  # DDPJOB_CHAOS_SDC names rank 3 after step 3; checks and probes every 2
            health = run(0, 10, 2, 2, result["verdicts"])
            result.update(checks=health.checks, checks_ok=health.checks - health.tally.mismatches)
            result["report"] = health.last_report
        elif scenario == "noisy":  # nobody reproduces: undecidable, nobody named, training verified
            health = run(0, 6, 2, 2, result["verdicts"], noisy=True)
            result.update(checks=health.checks, checks_ok=health.checks - health.tally.mismatches)
            result["why"] = [health.prober.run(7).verdict.why] if health.prober else []
            result["report"] = health.last_report
        elif scenario == "clean":  # 5 seeds x 8 probes: nobody is ever accused
            for seed in range(5):
                run(seed, 8, 4, 1, result["verdicts"])
    except Exception as err:
        result["error"] = f"{type(err).__name__}: {err}"
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
