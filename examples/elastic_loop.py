"""A hand-written DDP loop that is elastic: it trains on whatever world it finds, and when nodes leave or
join it goes on, its replicas verified in each world: healed in place (``DDPJOB_HEAL=1`` in the DDPJob's
env: the processes and their state kept, a joiner's state copied from a live replica), or else from its last
checkpoint, the workers restarted.

What a script must do to be elastic (docs/your-code.md, "Elastic jobs"):

1. **Resume from its checkpoint on start.** A resize that is not healed restarts every worker process
   (torchrun's agents re-rendezvous and start the script again at the new world size), so "start" and
   "resume" are the same code path: load the newest checkpoint if there is one.
2. **Re-shard its data for the world it finds.** Here the global batch is fixed (``GLOBAL_BATCH`` samples a
   step, whatever the world size) and is a pure function of the seed and the step: each epoch is one seeded
   permutation of the dataset, step s takes its next slice, and rank r of W takes the r-th of W parts. So a
   resize neither repeats nor skips a sample; a plain ``DistributedSampler`` would need ``set_epoch`` and a
   skip of the samples already seen to do the same. The step runs in the world it is given (``World``: the
   DDP wrapper, the step, rank and size), which a heal changes between two steps.
3. **Save often, from one rank, atomically** (write, then rename): the steps since the last save are
   trained again after a resize that is not healed.

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

from ddp_trainer.sync import HealingSyncHealth, SyncHealth, World

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
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)
    )  # wrapped in DDP by HealingSyncHealth
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    saved = args.checkpoint_dir / "elastic-loop.pt"
    step = 0
    if saved.exists():  # 1. resume: every rank reads the same file
        state = torch.load(saved, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
    if dist.get_rank() == 0:
        began = f"resumed from step {step}" if step else "starting at step 0"
        print(f"world size {dist.get_world_size()}: {began}")
    inputs, targets = data()

    def one_step(world: World) -> tuple[torch.Tensor, int]:
        mine = my_share(world.step, world.rank, world.size)  # 2. this world's share of the global batch
        loss = nn.functional.mse_loss(world.model(inputs[mine]), targets[mine], reduction="sum") * world.size
        optimizer.zero_grad()
        (loss / GLOBAL_BATCH).backward()  # DDP averages over W ranks: the mean over the global batch
        optimizer.step()
        return loss.detach() / GLOBAL_BATCH, len(mine)

    # start_step: the check compares the step too, and counts from where this world starts
    config = SyncHealth.Config.from_env(total_steps=steps, start_step=step)
    with HealingSyncHealth(model, optimizer, config) as health:  # a node that joins copies a live replica
        while health.current_step < steps:
            world = health.train_step(one_step)  # the one call: a lost peer or a joiner heals in it
            if world.changed and world.rank == 0:
                print(f"world size {world.size}: healed in place, going on from step {world.step}")
            if world.rank == 0 and world.step % SAVE_EVERY == 0:  # 3. one rank, write then rename
                args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
                partial = saved.with_suffix(".partial")
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                torch.save({**state, "step": world.step}, partial)
                partial.replace(saved)
        world = health.world()
    if world.rank == 0:
        print(f"trained to step {world.step} at world size {world.size}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
