"""What the no-code-change sync hook costs a Python process at start (``docs/your-code.md``, "1. Nothing").

Every Python process in a pod with the hook imports its ``sitecustomize``; one that is not a training rank
(pip, a shell's python, the torchrun agent of a multi-process pod) must pay next to nothing. This runs
``python -c pass`` (and ``python -c "import torch"``) with and without the hook's folder on PYTHONPATH,
interleaved, and prints the median wall time of each over ``--runs`` runs, and the differences.

    python bench/hook_startup_bench.py [--runs 21]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ddp_trainer import inject


def wall(code: str, env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return time.perf_counter() - started


def import_time(env: dict[str, str]) -> float:
    """The ``sitecustomize`` import's own cumulative time (``python -X importtime``), in seconds."""
    err = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "pass"], env=env, capture_output=True, text=True
    )
    for line in err.stderr.splitlines():
        parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
        if len(parts) == 3 and parts[2] == "sitecustomize":
            return int(parts[1]) / 1e6
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    runs = parser.parse_args().runs
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANK", "LOCAL_RANK")}
    with tempfile.TemporaryDirectory() as folder:
        hook = Path(folder) / "ddpjob-sync"
        inject.install(hook)
        cases = {
            "python -c pass, no hook": ("pass", base),
            "python -c pass, hook, not a rank": ("pass", {**base, "PYTHONPATH": str(hook)}),
            "python -c pass, hook, LOCAL_RANK=0": (
                "pass",
                {**base, "PYTHONPATH": str(hook), "LOCAL_RANK": "0"},
            ),
            "import torch, no hook": ("import torch", base),
            "import torch, hook, LOCAL_RANK=0": (
                "import torch",
                {**base, "PYTHONPATH": str(hook), "LOCAL_RANK": "0"},
            ),
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        for code, env in cases.values():  # warm the page cache and the .pyc files
            wall(code, env)
        hooked = []
        for _ in range(runs):
            for name, (code, env) in cases.items():
                times[name].append(wall(code, env))
            hooked.append(import_time({**base, "PYTHONPATH": str(hook), "LOCAL_RANK": "0"}))
    median = {name: statistics.median(values) * 1e3 for name, values in times.items()}
    print(f"median of {runs} runs each, interleaved; {sys.version.split()[0]}")
    for name, ms in median.items():
        print(f"  {name:38s} {ms:8.1f} ms")
    for case, reference in (
        ("python -c pass, hook, not a rank", "python -c pass, no hook"),
        ("python -c pass, hook, LOCAL_RANK=0", "python -c pass, no hook"),
        ("import torch, hook, LOCAL_RANK=0", "import torch, no hook"),
    ):
        print(f"  {case} - {reference}: {median[case] - median[reference]:+.1f} ms")
    own = statistics.median(hooked) * 1e3
    print(f"  the hook's sitecustomize import itself (-X importtime, a rank): {own:.2f} ms")


if __name__ == "__main__":
    main()
