"""Serving a pod's metrics: every local rank's series, from the multiprocess directory they write
(:func:`ddp_trainer.core.distributed.metrics_dir`), on ``DDPJOB_METRICS_PORT`` (local rank 0 serves), and
the directory changed where a world healed in place made its series anew (:func:`serve_anew`)."""

from __future__ import annotations

import glob
import logging
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.multiprocess import MultiProcessCollector

log = logging.getLogger(__name__)


class _Served:
    """prometheus-client's multiprocess collector (its ``merge``) of the directory this process serves, which
    a world healed in place changes (:func:`serve_anew`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def collect(self) -> Any:
        files = glob.glob(str(self.directory / "*.db"))
        return MultiProcessCollector.merge(files, accumulate=True)  # type: ignore[no-untyped-call]


_SERVED: list[_Served] = []


def serve_anew(directory: Path) -> None:
    """Serve ``directory`` where this process served another (a world healed in place: its series are made
    anew there, with the ranks' new labels); nothing where it serves none."""
    for served in _SERVED:
        served.directory = directory


def serve(port: int, directory: Path) -> bool:
    """Serve every local rank's series from ``directory`` on ``port`` (call on local rank 0 only).

    A port that cannot be bound is logged, not fatal: training matters more than its metrics.
    """
    registry = CollectorRegistry()
    served = _Served(directory)
    registry.register(served)  # type: ignore[arg-type]
    try:
        start_http_server(port, registry=registry)
    except OSError as err:
        log.warning("metrics: cannot serve on port %d (%s); continuing without a metrics endpoint", port, err)
        return False
    _SERVED.append(served)
    return True
