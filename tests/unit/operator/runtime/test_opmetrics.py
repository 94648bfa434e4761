"""ddpjob_jobs and ddpjob_job_info: read from the operator's index of DDPJobs at each scrape, following a
job's phase, gone when the DDPJob is; and the API client's pool holds every reconcile that can run at once."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY

from ddp_operator.decide import decision
from ddp_operator.decide.plan import Plan
from ddp_operator.observe import live
from ddp_operator.observe.metrics import LastResize, Progress
from ddp_operator.runtime import handlers, opmetrics, reads
from helpers.reconciling import NOW, ddpjob_body, job_object, observed, pod_object


def _job(name: str, phase: str | None) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name}, "status": {"phase": phase} if phase else {}}


def _info(name: str, phase: str) -> float | None:
    labels = {"ddpjob_namespace": "ns", "ddpjob": name, "phase": phase}
    return REGISTRY.get_sample_value("ddpjob_job_info", labels)


def _count(phase: str) -> float | None:
    return REGISTRY.get_sample_value("ddpjob_jobs", {"phase": phase})


@pytest.fixture
def index() -> Any:
    bodies: dict[tuple[str, str], list[dict[str, Any]]] = {}
    opmetrics.WATCHED.watch(bodies)
    yield bodies
    opmetrics.WATCHED.watch({})


def test_job_info_follows_the_index_and_goes_with_a_deleted_job(index: dict[Any, Any]) -> None:
    index.update({("ns", "a"): [_job("a", "Running")], ("ns", "b"): [_job("b", None)]})
    assert (_info("a", "Running"), _info("b", "Pending")) == (1.0, 1.0)
    assert (_count("Running"), _count("Pending"), _count("Succeeded")) == (1.0, 1.0, 0.0)

    index[("ns", "a")] = [_job("a", "Succeeded")]
    assert (_info("a", "Running"), _info("a", "Succeeded")) == (None, 1.0)
    assert (_count("Running"), _count("Succeeded")) == (0.0, 1.0)

    del index[("ns", "b")]  # Kopf drops a deleted DDPJob from its index
    assert _info("b", "Pending") is None
    assert _count("Pending") == 0.0


def test_sync_state_says_a_job_that_built_no_ddp_model_apart_from_one_not_reported(
    index: dict[Any, Any],
) -> None:
    def with_sync(name: str, reason: str) -> dict[str, Any]:
        body = _job(name, "Succeeded")
        body["status"]["conditions"] = [
            {"type": "Ready", "reason": "Succeeded"},
            {"type": "SyncVerified", "reason": reason},
        ]
        return body

    index.update({("ns", "n"): [with_sync("n", "NoDDPModel")], ("ns", "v"): [with_sync("v", "BitIdentical")]})
    index[("ns", "q")] = [_job("q", "Running")]

    def state(name: str, reason: str) -> float | None:
        labels = {"ddpjob_namespace": "ns", "ddpjob": name, "reason": reason}
        return REGISTRY.get_sample_value("ddpjob_sync_state", labels)

    assert (state("n", "NoDDPModel"), state("v", "BitIdentical"), state("q", "NotYetReported")) == (
        1.0,
        1.0,
        1.0,
    )
    assert state("n", "NotYetReported") is None
    del index[("ns", "n")]
    assert state("n", "NoDDPModel") is None


def test_a_reconcile_is_counted_by_its_result() -> None:
    before = REGISTRY.get_sample_value("ddpjob_reconciles_total", {"result": "ok"}) or 0.0
    opmetrics.observe_reconcile("ok", 0.01)
    assert REGISTRY.get_sample_value("ddpjob_reconciles_total", {"result": "ok"}) == before + 1


class _Changing(dict[tuple[str, str], list[dict[str, Any]]]):
    """An index that another thread changes while the first reads of it run (as Kopf's loop does)."""

    def __init__(self, changes: int) -> None:
        super().__init__({("ns", "a"): [_job("a", "Running")]})
        self.changes = changes

    def values(self) -> Any:
        if self.changes:
            self.changes -= 1
            raise RuntimeError("dictionary changed size during iteration")
        return super().values()


def test_a_scrape_reads_again_an_index_that_changed_meanwhile() -> None:
    assert opmetrics.job_phases(_Changing(changes=2)) == [
        opmetrics.Watched("ns", "a", "Running", "NotYetReported")
    ]
    with pytest.raises(RuntimeError):
        opmetrics.job_phases(_Changing(changes=5))


def test_the_client_pool_holds_every_reconcile_that_runs_at_once() -> None:
    assert reads.CONNECTIONS > handlers.HANDLER_THREADS + 1  # Kopf's handler threads and the timer's


def test_an_elastic_jobs_size_is_read_from_its_status_while_it_runs_and_resizes_are_counted(
    index: dict[Any, Any],
) -> None:
    """ddpjob_elastic_nodes and ddpjob_elastic_desired_nodes follow status.elastic while the job has not
    finished (the below-desired alert must end with it); a rigid job has none; each resize a plan makes
    counts once in ddpjob_elastic_resizes_total, by namespace and reason."""
    elastic = _job("el", "Running")
    elastic["status"]["elastic"] = {"nodes": 2, "desired": 3, "resizes": 0}
    index[("ns", "el")] = [elastic]
    index[("ns", "rigid")] = [_job("rigid", "Running")]
    labels = {"ddpjob_namespace": "ns", "ddpjob": "el"}
    assert REGISTRY.get_sample_value("ddpjob_elastic_nodes", labels) == 2
    assert REGISTRY.get_sample_value("ddpjob_elastic_desired_nodes", labels) == 3
    rigid = {"ddpjob_namespace": "ns", "ddpjob": "rigid"}
    assert REGISTRY.get_sample_value("ddpjob_elastic_nodes", rigid) is None
    elastic["status"]["phase"] = "Succeeded"
    assert REGISTRY.get_sample_value("ddpjob_elastic_nodes", labels) is None
    counted = {"ddpjob_namespace": "ns", "reason": "Scaled"}
    before = REGISTRY.get_sample_value("ddpjob_elastic_resizes_total", counted) or 0.0
    resized = {"elastic": {"nodes": 2, "desired": 3, "resizes": 1, "lastResize": {"reason": "Scaled"}}}
    body = {"metadata": {"namespace": "ns", "name": "el"}, "status": {"elastic": {"resizes": 0}}}
    opmetrics.observe_plan(body, Plan(resized))
    opmetrics.observe_plan({**body, "status": resized}, Plan(resized))  # the next reconcile: no new resize
    assert REGISTRY.get_sample_value("ddpjob_elastic_resizes_total", counted) == before + 1


def test_the_families_list_is_what_the_operator_exports() -> None:
    """tests/integration/monitoring reads opmetrics.FAMILIES: each must be registered, or a panel could
    query nothing."""
    exported = {metric.name for metric in REGISTRY.collect()}
    assert set(opmetrics.FAMILIES) <= exported, set(opmetrics.FAMILIES) - exported


def test_a_world_shrunk_by_a_silent_peer_is_counted_under_its_own_reason() -> None:
    """Not only spec.nodes changes: the reconcile that reads the trainer's smaller world counts it in
    ddpjob_elastic_resizes_total{reason="NodeSilent"}, once."""
    previous = {
        "phase": "Running",
        "attempt": 1,
        "elastic": {"nodes": 2, "nodesFrom": "Trainer", "resizes": 0},
    }
    body = ddpjob_body(previous, nodes=2, elastic={"minNodes": 1, "maxNodes": 2})
    change = LastResize("NodeSilent", 2, 1, NOW.timestamp() - 8.0, 6.0, round=1)
    latest = Progress(
        step=9, world_size=2, resizes=1, last_resize=change, changes=(change,)
    )  # 1 node x procsPerNode 2
    snapshot = live.record(None, 1, 9400, [], NOW.timestamp(), latest)
    plan = decision.decide(
        observed(body, [job_object(1)], [pod_object(1, 0), pod_object(1, 1)], NOW, snapshot)
    )
    counted = {"ddpjob_namespace": body["metadata"]["namespace"], "reason": "NodeSilent"}
    before = REGISTRY.get_sample_value("ddpjob_elastic_resizes_total", counted) or 0.0
    opmetrics.observe_plan(body, plan)
    opmetrics.observe_plan({**body, "status": plan.status}, plan)
    assert REGISTRY.get_sample_value("ddpjob_elastic_resizes_total", counted) == before + 1
