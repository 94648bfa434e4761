"""A hand-written DDP loop that is elastic: it trains on whatever world it finds, and when nodes leave or
join it goes on from its last checkpoint, its replicas verified in each world.

What a script must do to be elastic (docs/your-code.md, "Elastic jobs"):

1. **Resume from its checkpoint on start.** A resize restarts every worker process (torchrun's agents
   re-rendezvous and start the script again at the new world size), so "start" and "resume" are the same
   code path: load the newest checkpoint if there is one.
2. **Re-shard its data for the world it finds.** Here the global batch is fixed (``GLOBAL_BATCH`` samples a
   step, whatever the world size) and is a pure function of the seed and the step: each epoch is one seeded
   permutation of the dataset, step s takes its next slice, and rank r of W takes the r-th of W parts. So a
   resize neither repeats nor skips a sample; a plain ``DistributedSampler`` would need ``set_epoch`` and a
   skip of the samples already seen to do the same.
3. **Save often, from one rank, atomically** (write, then rename): the steps since the last save are
   trained again after a resize.

Run it with ``ddpjob local examples/elastic-loop.yaml`` (3 nodes, any of which may leave). ``STEPS`` sets the
number of optimizer steps; ``--checkpoint-dir`` is where the checkpoints go (a volume every pod shares).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_trainer.sync import SyncHealth

SAMPLES, GLOBAL_BATCH, SAVE_EVERY = 4096, 48, 5


def data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1234)
    inputs = torch.randn(SAMPLES, 16, generator=generator)
    return inputs, inputs.sum(dim=1, keepdim=True)


def my_share(step: int, rank: int, world: int) -> torch.Tensor:
    """The sample indices rank ``rank`` of ``world`` trains on at ``step`` (0-based)."""
    per_epoch = SAMPLES // GLOBAL_BATCH
    epoch, k = divmod(step, per_epoch)
    order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(epoch))
    batch = order[k * GLOBAL_BATCH : (k + 1) * GLOBAL_BATCH]
    return batch[rank * GLOBAL_BATCH // world : (rank + 1) * GLOBAL_BATCH // world]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint-dir", type=Path, default=Path("/checkpoints"))
    args = parser.parse_args()
    steps = int(os.environ.get("STEPS", "200"))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    saved = args.checkpoint_dir / "elastic-loop.pt"
    step = 0
    if saved.exists():  # 1. resume: every rank reads the same file
        state = torch.load(saved, weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
    if rank == 0:
        print(f"world size {world}: {'resumed from step ' + str(step) if step else 'starting at step 0'}")
    inputs, targets = data()
    # start_step: the check compares the step too, and counts from where this world starts
    config = SyncHealth.Config.from_env(total_steps=steps, start_step=step)
    with SyncHealth(model, optimizer, config) as health:
        while step < steps:
            mine = my_share(step, rank, world)  # 2. this world's share of the fixed global batch
            loss = nn.functional.mse_loss(model(inputs[mine]), targets[mine], reduction="sum") * world
            optimizer.zero_grad()
            (loss / GLOBAL_BATCH).backward()  # DDP averages over W ranks: the mean over the global batch
            optimizer.step()
            step += 1
            health.step(loss.detach() / GLOBAL_BATCH, samples=len(mine))
            if rank == 0 and step % SAVE_EVERY == 0:  # 3. one rank, write then rename
                args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
                partial = saved.with_suffix(".partial")
                state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
                torch.save({**state, "step": step}, partial)
                partial.replace(saved)
    if rank == 0:
        print(f"trained to step {step} at world size {world}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
