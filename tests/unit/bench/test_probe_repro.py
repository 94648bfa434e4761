"""The compute probe across fresh processes (issue 43, item 4), on CPU: four processes, training steps
between the digests compared, agree; the SDC drill's negative control differs. The same script runs on a
GPU in ``make gpu-check`` (GPT-2, fp32 and bf16)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import REPO

pytestmark = pytest.mark.slow


def test_fresh_processes_agree_on_the_digest_and_the_perturbed_one_differs() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "probe_repro.py"), "--device=cpu", "--model=mlp", "--steps=2"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    digests = result["digests"]
    assert digests["A"] == digests["B_loaded"] and digests["B_trained"] == digests["C"], result
    assert digests["A"] != digests["B_trained"], result  # the training between them changed the state
    assert result["control_digest"] != digests["C"], result  # the drill's wrong arithmetic is seen
    assert (result["agree"], result["control_differs"], done.returncode) == (True, True, 0), done.stderr[
        -2000:
    ]
