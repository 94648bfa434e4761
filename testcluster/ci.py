"""A tier that cannot run here: a skip on a person's machine, a failure in CI.

``.ci/run`` runs pytest with ``CI=true`` (as CI services set it). There a test that cannot run (no root for
the test cluster, no real nodes, no images, a missing tool or dev dependency) fails the run and says why,
so a green CI cannot hide a missing tier. Elsewhere it skips, saying the same. Only the GPU tests skip in
CI too (the ``gpu`` marker: CI has no GPU, ``make gpu-check`` runs them); they do not use this.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

CI_FAILS = "CI=true: a tier that cannot run fails the run instead of skipping (testcluster/ci.py)"


def in_ci() -> bool:
    """Whether this run is CI's (``CI=true``)."""
    return os.environ.get("CI") == "true"


def skip_or_fail(reason: str) -> NoReturn:
    """Skips the test (or the module, or every test of a fixture) saying ``reason``; fails it in CI."""
    if in_ci():
        pytest.fail(f"{reason} ({CI_FAILS})", pytrace=False)
    pytest.skip(reason, allow_module_level=True)
