"""examples/elastic_loop.py as shipped, run so that a test of a lost pod waits for the replacement to grow
the world back instead of racing the run's end: the script has no end (``STEPS`` a billion) in every world
but a world of :data:`FULL_WORLD` that resumed from a checkpoint (the one the replacement grew), which trains
:data:`AFTER_REGROWN` steps more and ends.

    python elastic_loop_until_regrown.py EXAMPLE [the example's arguments: --checkpoint-dir=DIR]
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

import torch

FULL_WORLD, AFTER_REGROWN = 3, 100

example = sys.argv.pop(1)
folder = next(Path(arg.split("=", 1)[1]) for arg in sys.argv if arg.startswith("--checkpoint-dir="))
saved = folder / "elastic-loop.pt"  # the example's own checkpoint: every rank reads it before any trains
if int(os.environ["WORLD_SIZE"]) == FULL_WORLD and saved.exists():
    os.environ["STEPS"] = str(int(torch.load(saved, weights_only=True)["step"]) + AFTER_REGROWN)
else:
    os.environ["STEPS"] = str(10**9)
runpy.run_path(example, run_name="__main__")
