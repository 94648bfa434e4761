"""The operator's own timer (ticker) and what the indexes keep (handlers.slim)."""

from __future__ import annotations

import copy
import json
import threading
import time

import kopf
import pytest

from ddp_operator.api import names
from ddp_operator.api.spec import parse
from ddp_operator.children import render
from ddp_operator.observe import facts
from ddp_operator.runtime import handlers, heap
from ddp_operator.runtime.ticker import Ticker


def _wait(check: object, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_every_key_is_ticked_each_round_and_a_failing_tick_does_not_stop_the_round() -> None:
    keys = {("ns", "a"): 1, ("ns", "b"): 1, ("ns", "c"): 1}
    ticked: list[tuple[str, str]] = []

    def tick(key: tuple[str, str]) -> None:
        ticked.append(key)
        if key == ("ns", "a"):
            raise RuntimeError("the API server refused")

    ticker = Ticker(0.02, keys.keys, tick)
    ticker.start()
    _wait(lambda: ticker.rounds >= 2)
    del keys[("ns", "b")]  # a deleted DDPJob leaves the index: it is ticked no more
    rounds = ticker.rounds
    _wait(lambda: ticker.rounds >= rounds + 2)
    ticker.stop()
    assert ticked[:3] == [("ns", "a"), ("ns", "b"), ("ns", "c")]
    assert ticked[-2:] == [("ns", "a"), ("ns", "c")]
    ticker.start()  # a stopped ticker does not start again
    assert not ticker._thread or not ticker._thread.is_alive()


def test_nothing_is_ticked_while_paused() -> None:
    paused = threading.Event()
    paused.set()
    ticked = threading.Event()
    ticker = Ticker(0.01, lambda: ["k"], lambda _: ticked.set(), paused)
    try:
        ticker.start()
        time.sleep(0.1)  # shows that nothing is ticked: ten rounds' time while paused
        assert not ticked.is_set() and ticker.rounds == 0
        paused.clear()
        assert ticked.wait(5)
    finally:
        ticker.stop()


def test_after_each_round_the_timer_gives_freed_heap_back_at_most_every_trim_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A burst's freed memory stays resident until ``malloc_trim`` (ddp_operator.runtime.heap): the operator's
    timer calls it after a round, rate-limited; and on this glibc the call is really there."""
    assert heap._TRIM is not None, "glibc's malloc_trim was not found"
    trims: list[float] = []
    now = [100.0]
    monkeypatch.setattr(heap, "give_back", lambda: trims.append(now[0]) or True)
    trimmer = heap.Trimmer(every=10.0, clock=lambda: now[0])
    for t in (100.0, 105.0, 109.9, 110.0, 125.0):
        now[0] = t
        trimmer()
    assert trims == [100.0, 110.0, 125.0]

    rounds: list[int] = []
    keys = {("ns", "a"): 1}.keys
    ticker = Ticker(0.01, keys, lambda _: None, after_round=lambda: rounds.append(1))
    ticker.start()
    _wait(lambda: len(rounds) >= 2)
    ticker.stop()
    assert isinstance(handlers.TIMER.after_round, heap.Trimmer)


def test_the_operator_runs_on_glibcs_heap_unless_the_user_chose_an_allocator() -> None:
    assert heap.allocator_env({}) == {"PYTHONMALLOC": "malloc", "MALLOC_ARENA_MAX": "2"}
    assert heap.allocator_env({"MALLOC_ARENA_MAX": "4"}) == {"PYTHONMALLOC": "malloc"}
    assert heap.allocator_env({"PYTHONMALLOC": "pymalloc"}) == {}  # the user's choice; also: started again


def test_indexes_keep_objects_without_managed_fields_or_the_last_applied_annotation() -> None:
    body = {
        "metadata": {
            "name": "j",
            "managedFields": [{"manager": "kubectl"}],
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}", "keep": "1"},
        },
        "spec": {"nodes": 2},
    }
    slim = handlers.slim(body)
    assert slim == {"metadata": {"name": "j", "annotations": {"keep": "1"}}, "spec": {"nodes": 2}}
    assert body["metadata"]["managedFields"], "the object Kopf holds is left as it was"


def test_the_jobs_index_keeps_a_job_without_its_pod_template() -> None:
    job = {
        "metadata": {"name": "j-1", "labels": {"a": "1"}, "managedFields": [{}]},
        "spec": {"suspend": True, "completions": 2, "template": {"spec": {"containers": [{}]}}},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]},
    }
    assert handlers.slim_job(job) == {
        "metadata": {"name": "j-1", "labels": {"a": "1"}},
        "spec": {"suspend": True, "completions": 2},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]},
    }


def test_the_pods_index_keeps_what_observe_reads_and_observe_sees_the_same() -> None:
    spec = parse(
        {
            "apiVersion": "ddpjob.io/v1alpha1",
            "kind": "DDPJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "u"},
            "spec": {"nodes": 2, "procsPerNode": 2, "device": "cpu"},
        }
    )
    job = render.render_job(spec, 1)
    template = job["spec"]["template"]
    report = '{"result": "Interrupted", "reason": "Terminated"}'
    pods = []
    for index, state in enumerate(({"terminated": {"exitCode": 143, "message": report}}, {"running": {}})):
        pod = copy.deepcopy(template)
        pod["metadata"]["name"] = f"j-1-{index}"
        pod["metadata"].setdefault("annotations", {})[names.COMPLETION_INDEX_ANNOTATION] = str(index)
        pod["metadata"]["deletionTimestamp"] = "2026-11-24T12:00:00Z"
        pod["spec"]["nodeName"] = f"node-{index}"
        pod["status"] = {
            "phase": "Running",
            "podIP": f"10.0.0.{index}",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": names.CONTAINER_NAME, "state": state}],
        }
        pods.append(pod)
    slimmed = [handlers.slim_pod(pod) for pod in pods]
    assert all(pod["spec"] == {"nodeName": f"node-{i}"} for i, pod in enumerate(slimmed))
    assert len(json.dumps(slimmed)) < len(json.dumps(pods)) / 3
    failed = {**job, "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "x"}]}}
    previous = {"attempt": 1}
    assert facts.observe(previous, [failed], slimmed) == facts.observe(previous, [failed], pods)


def test_the_timer_leaves_alone_a_ddpjob_an_event_just_reconciled_and_not_one_it_reconciled_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = ("ns", "j")
    running = {"metadata": {"name": "j"}, "spec": {}, "status": {"phase": "Running"}}
    monkeypatch.setitem(handlers._KOPF, "settings", kopf.OperatorSettings())
    for name in handlers.INDEXES:
        monkeypatch.setitem(handlers._KOPF, name, {key: [running]} if name == "ddpjob_bodies" else {})
    calls: list[bool] = []
    monkeypatch.setattr(handlers.reconcile, "reconcile", lambda *_: calls.append(True))
    monkeypatch.setitem(handlers._LAST, key, time.monotonic())  # an event's reconcile, just now
    handlers._tick(key)
    assert calls == []
    monkeypatch.setitem(handlers._LAST, key, time.monotonic() - handlers.TIMER_INTERVAL_SECONDS)
    handlers._tick(key)
    handlers._tick(key)  # the timer's own reconcile does not hold back its next round
    assert calls == [True, True]
