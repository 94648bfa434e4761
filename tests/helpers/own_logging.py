"""A DDP script written the way public examples are (pytorch/examples' ``main.py``, hydra's apps): its own
argument parsing, its own logging configured first (``logging.basicConfig(filename=...)``, every record of
INFO and up into its own file), then torch and a plain DDP loop that logs a line of its own each step. No
ddpjob code: run under the no-code-change hook, the hook's lines must stay out of the script's file.

Run by torchrun, or as one process with ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` set."""

from __future__ import annotations

import argparse
import logging

parser = argparse.ArgumentParser(description="a DDP script with its own logging")
parser.add_argument("--log-file", required=True, help="where this script logs (every rank appends)")
parser.add_argument("--steps", type=int, default=10)
args = parser.parse_args()
logging.basicConfig(
    filename=args.log_file, level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
)
log = logging.getLogger("train")

import torch  # noqa: E402  (after the logging, as the scripts this one stands for do it)
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(1 + dist.get_rank())
    for step in range(1, args.steps + 1):
        inputs = torch.randn(16, 8)
        loss = nn.functional.mse_loss(model(inputs), inputs.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        log.info("rank %d step %d loss %.4f", dist.get_rank(), step, loss.item())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
