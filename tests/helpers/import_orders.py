"""A plain DDP script (no ddpjob code) whose head imports torch the ways public scripts do, run by
tests/integration/trainer/test_autoinstrument.py under torchrun with the no-code hook on PYTHONPATH.
``HEAD`` in the
environment picks the head; the body is the same for all. Run as a file, or with ``-m import_orders``.

transformers, datasets and accelerate all probe ``importlib.util.find_spec("torch")`` before they import it
(or import it for the script), which is what a hook waiting for ``import torch`` must survive."""

# ruff: noqa: E402, F401 (the order of the imports is what this file tests)
import importlib
import importlib.util
import os

HEAD = os.environ.get("HEAD", "")
if HEAD == "transformers":  # run_clm.py and most Trainer scripts begin so
    from transformers import AutoConfig, set_seed
elif HEAD == "datasets":
    import datasets
elif HEAD == "accelerate":
    import accelerate
    from accelerate import Accelerator
elif HEAD == "find_spec":
    assert importlib.util.find_spec("torch") is not None
elif HEAD == "import_module":
    importlib.import_module("torch")

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(1 + dist.get_rank())
    for _ in range(int(os.environ.get("STEPS", "10"))):
        inputs = torch.randn(16, 8)
        loss = nn.functional.mse_loss(model(inputs), inputs.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
