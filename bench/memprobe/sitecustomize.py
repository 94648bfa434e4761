"""Loaded by a Python process started with this folder on ``PYTHONPATH`` (the operator in
``operator_bench.py --tracemalloc``): with ``DDPJOB_TRACEMALLOC_OUT`` set it traces Python allocations from
start-up, and on SIGUSR1 appends one JSON line to that file: the traced total and the live bytes grouped by
package (``kopf``, ``kubernetes``, ``ddp_operator``, ``json``, ...), largest first. Never used by the product.
"""

from __future__ import annotations

import json
import os
import signal
import tracemalloc
from types import FrameType

OUT = os.environ.get("DDPJOB_TRACEMALLOC_OUT")


def _package(filename: str) -> str:
    parts = filename.replace("\\", "/").split("/")
    for marker in ("site-packages", "ddp_operator", "python3.11", "python3.12", "python3.13"):
        if marker in parts:
            at = parts.index(marker)
            if marker == "ddp_operator":
                return "ddp_operator." + parts[-1].removesuffix(".py")
            rest = parts[at + 1 :]
            return rest[0].removesuffix(".py") if rest else marker
    return filename


def _dump(_signum: int, _frame: FrameType | None) -> None:
    assert OUT is not None
    snapshot = tracemalloc.take_snapshot()
    by_package: dict[str, int] = {}
    by_line: list[tuple[str, int]] = []
    for stat in snapshot.statistics("filename"):
        name = _package(stat.traceback[0].filename)
        by_package[name] = by_package.get(name, 0) + stat.size
    for stat in snapshot.statistics("lineno")[:15]:
        frame = stat.traceback[0]
        by_line.append((f"{_package(frame.filename)}:{frame.lineno}", stat.size))
    current, peak = tracemalloc.get_traced_memory()
    top = sorted(by_package.items(), key=lambda kv: -kv[1])[:20]
    line = {
        "traced_mib": round(current / 2**20, 1),
        "traced_peak_mib": round(peak / 2**20, 1),
        "by_package_mib": {k: round(v / 2**20, 2) for k, v in top},
        "by_line_mib": {k: round(v / 2**20, 2) for k, v in by_line},
    }
    with open(OUT, "a") as out:
        out.write(json.dumps(line) + "\n")


if OUT:
    tracemalloc.start(1)
    signal.signal(signal.SIGUSR1, _dump)
