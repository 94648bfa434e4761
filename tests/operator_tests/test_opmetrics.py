"""ddpjob_job_info: one series per watched DDPJob, following its phase, gone when the DDPJob is."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY

from ddp_operator import opmetrics


def _job(name: str, phase: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name}, "status": {"phase": phase}}


def _info(name: str, phase: str) -> float | None:
    labels = {"ddpjob_namespace": "ns", "ddpjob": name, "phase": phase}
    return REGISTRY.get_sample_value("ddpjob_job_info", labels)


def test_job_info_follows_the_index_and_goes_with_a_deleted_job() -> None:
    opmetrics.observe_reconcile("ok", 0.01, {"ns": [_job("a", "Running"), _job("b", "Pending")]})
    assert (_info("a", "Running"), _info("b", "Pending")) == (1.0, 1.0)

    opmetrics.observe_reconcile("ok", 0.01, {"ns": [_job("a", "Succeeded"), _job("b", "Pending")]})
    assert (_info("a", "Running"), _info("a", "Succeeded")) == (None, 1.0)

    opmetrics.forget_job("ns", "b")  # the DELETED event, before any other reconcile
    assert _info("b", "Pending") is None

    opmetrics.observe_reconcile("ok", 0.01, {"ns": []})
    assert _info("a", "Succeeded") is None
