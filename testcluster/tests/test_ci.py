"""A tier that cannot run: skipped on a person's machine, failed in CI (testcluster/ci.py)."""

from __future__ import annotations

import pytest

from testcluster.ci import skip_or_fail


@pytest.mark.parametrize("ci", [None, "", "false", "1"])
def test_outside_ci_a_tier_that_cannot_run_skips_saying_why(
    monkeypatch: pytest.MonkeyPatch, ci: str | None
) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match=r"^no real nodes: no runc$"):
        skip_or_fail("no real nodes: no runc")


def test_with_ci_true_a_tier_that_cannot_run_fails_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"^no real nodes: no runc \(CI=true: .* fails the run"):
        skip_or_fail("no real nodes: no runc")
