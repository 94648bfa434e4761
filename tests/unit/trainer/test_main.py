"""The trainer's entry point (``python -m ddp_trainer``): when a SIGTERM stops it, by the phase it is in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SET_UP_UNDER_SIGTERM = textwrap.dedent(
    """
    import json, os, signal, sys
    from ddp_trainer import __main__ as entry
    from ddp_trainer.train import runner

    seen = {}

    class SettingUp:
        '''Stands for the trainer's session while it sets up, which a SIGTERM reaches (the pod deleted).'''

        def __init__(self, *args):
            stop = args[5]
            os.kill(os.getpid(), signal.SIGTERM)
            seen["requested"] = stop.requested

        def run(self):
            return 0, {"result": "Succeeded"}

    runner.Session = SettingUp
    code = entry.main(["--device=cpu", "--steps=1"])
    print(json.dumps({"code": code, **seen}))
    """
)


def test_a_sigterm_once_the_group_formed_is_a_stop_request_not_an_end(tmp_path: Path) -> None:
    """Seen on real nodes: a pod deleted while its workers set up (after the process group formed, while
    the bucket's client was opened) ended them at once, and their peers failed in their first collective
    ("Connection closed by peer"): a preemption taken for a crash. From the moment the group formed, the
    signal only asks the ranks to stop at the next step boundary (and checkpoint there)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROMETHEUS_", "DDPJOB_", "RANK"))}
    env |= {"DDPJOB_METRICS_PORT": "0", "DDPJOB_TERMINATION_LOG": str(tmp_path / "report.json")}
    done = subprocess.run(
        [sys.executable, "-c", SET_UP_UNDER_SIGTERM],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said == {"code": 0, "requested": True}, done.stderr[-3000:]
    assert "received SIGTERM: stopping at the next step boundary" in done.stderr
