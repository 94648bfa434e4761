"""A pod's metrics served from the multiprocess directory, and from the new one once a world healed in place
made its series anew there (reporting/serving.py), in a process of its own: prometheus-client's
multiprocess mode is chosen from the environment, which a test process must not change for others."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from helpers.torchrun_helpers import free_port

SCRIPT = textwrap.dedent(
    """
    import os, sys, urllib.request
    first, second, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = first
    from prometheus_client import Gauge, values
    from ddp_trainer.reporting import serving

    def scrape():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            return sorted(l for l in answer.read().decode().splitlines() if l.startswith("ddp_"))

    Gauge("ddp_step", "", ["rank"], multiprocess_mode="mostrecent", registry=None).labels(rank="1").set(7)
    assert serving.serve(port, __import__("pathlib").Path(first))
    print(scrape())
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = second  # the healed world's directory, as the runner does
    values.ValueClass = values.get_value_class()
    Gauge("ddp_step", "", ["rank"], multiprocess_mode="mostrecent", registry=None).labels(rank="0").set(8)
    serving.serve_anew(__import__("pathlib").Path(second))
    print(scrape())
    """
)


def test_a_healed_world_is_served_from_its_own_directory_without_the_old_ranks(tmp_path: Path) -> None:
    first, second = tmp_path / "world-1", tmp_path / "world-2"
    first.mkdir()
    second.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(first), str(second), str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.splitlines()
    assert before == "['ddp_step{rank=\"1\"} 7.0']", done.stdout
    assert after == "['ddp_step{rank=\"0\"} 8.0']", done.stdout  # rank 1 of the old world is gone
