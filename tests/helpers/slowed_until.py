"""A script run slowed down until a test says so: every optimizer step sleeps :data:`SLOW_SECONDS` until the
file named by ``SLOWED_UNTIL`` exists, then the script runs at full speed. So a test of a lost pod sees the
loss, the heal and the grow back while the script still trains, and then lets it end, instead of racing a
fixed length of training against the replacement's start.

    python slowed_until.py SCRIPT [the script's arguments]
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

from torch.optim.optimizer import register_optimizer_step_post_hook

SLOW_SECONDS = 0.1
flag = Path(os.environ["SLOWED_UNTIL"])


def slow(optimizer: Any, args: Any, kwargs: Any) -> None:
    if not flag.exists():
        time.sleep(SLOW_SECONDS)


register_optimizer_step_post_hook(slow)
script = sys.argv.pop(1)
runpy.run_path(script, run_name="__main__")
