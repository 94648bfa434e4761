"""Every resize of an elastic job is seen, whatever caused it (issue 54 item 6; decide/resize.py):
``status.elastic.nodes`` is the world the trainer says trains, and each change of it counts once, with its
reason: a scale the operator made, or the launchers' record of a node lost, gone silent or rejoined."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from ddp_operator.api import crd, reasons, typed_status
from ddp_operator.decide import decision
from ddp_operator.decide.plan import Plan
from ddp_operator.observe import live
from ddp_operator.observe.metrics import LastResize, Progress
from ddp_operator.runtime.recent import Recent
from ddp_operator.runtime.reconcile import merge_patch
from helpers.reconciling import NOW, ddpjob_body, job_object, observed, pod_object

ELASTIC = {"minNodes": 1, "maxNodes": 4}
PROCS = 2  # the helper's procsPerNode: the trainer's world size is nodes x 2
STAMP = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")


def _job(size: int) -> dict[str, Any]:
    job = job_object(1)
    job["spec"]["completions"] = job["spec"]["parallelism"] = size
    return job


def _reading(
    nodes: int | None, change: LastResize | None = None, count: int = 0, earlier: tuple[LastResize, ...] = ()
) -> live.Snapshot:
    """A reading whose launchers recorded ``earlier`` changes and then ``change``, the last."""
    changes = (*earlier, change) if change is not None else earlier
    latest = Progress(
        step=50,
        world_size=nodes * PROCS if nodes else None,
        resizes=count,
        last_resize=change,
        changes=changes,
    )
    return live.record(None, 1, 9400, [], NOW.timestamp(), latest)


def _reconcile(
    status: dict[str, Any], nodes: int, size: int, pods: int, snapshot: live.Snapshot | None
) -> Plan:
    body = ddpjob_body(status, nodes=nodes, elastic=ELASTIC)
    running = [pod_object(1, i) for i in range(pods)]
    return decision.decide(observed(body, [_job(size)], running, NOW, snapshot))


def test_a_silent_peer_then_its_rejoin_are_each_counted_with_their_reason() -> None:
    """3 pods stay ready while the trainer's world goes to 2 (a node went silent): nodes is 2, the resize
    counted as NodeSilent with the seconds it cost, a Warning; the same reading again counts nothing;
    the world back at 3 is NodeRejoined, a Normal event."""
    previous = {
        "phase": "Running",
        "attempt": 1,
        "elastic": {"nodes": 3, "nodesFrom": "Trainer", "resizes": 0},
    }
    stopped = NOW.timestamp() - 12.0
    silent = LastResize(reasons.NODE_SILENT, 3, 2, stopped, 9.46, round=1, mode=reasons.HEALED)
    plan = _reconcile(previous, 3, 3, 3, _reading(2, silent, 1))
    elastic = plan.status["elastic"]
    assert (elastic["nodes"], elastic["nodesFrom"], elastic["resizes"]) == (2, "Trainer", 1), elastic
    assert elastic["lastResize"] == {
        "from": 3,
        "to": 2,
        "reason": "NodeSilent",
        "time": (NOW - dt.timedelta(seconds=12)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "secondsLost": 9.5,
        "mode": "healed",
    }
    assert elastic["summary"] == "2/3 (1-4)"
    resized = [e for e in plan.events if e.reason == reasons.RESIZED]
    assert [e.type for e in resized] == ["Warning"], plan.events
    assert "from 3 to 2 nodes (NodeSilent: a node went silent" in resized[0].message
    assert "), healed in place: the survivors kept their processes and state, " in resized[0].message
    assert plan.resize_job is None  # the Job keeps spec.nodes: the dropped pod's place is kept
    again = _reconcile({**previous, **plan.status}, 3, 3, 3, _reading(2, silent, 1))
    assert again.status["elastic"]["resizes"] == 1
    assert not [e for e in again.events if e.reason == reasons.RESIZED]
    back = LastResize(reasons.NODE_REJOINED, 2, 3, NOW.timestamp() - 3.0, 2.0, round=2)
    grown = _reconcile({**previous, **plan.status}, 3, 3, 3, _reading(3, back, 2, (silent,)))
    elastic = grown.status["elastic"]
    assert (elastic["nodes"], elastic["resizes"], elastic["lastResize"]["reason"]) == (3, 2, "NodeRejoined")
    assert elastic["lastResize"]["mode"] == "restarted"  # a grow restarts (an older trainer says no mode)
    grew = [e.message for e in grown.events if e.reason == reasons.RESIZED]
    assert len(grew) == 1 and "its workers restarted from the last checkpoint" in grew[0], grown.events
    assert [e.type for e in grown.events if e.reason == reasons.RESIZED] == ["Normal"]


def test_a_lost_node_is_counted_as_node_lost() -> None:
    previous = {
        "phase": "Running",
        "attempt": 1,
        "elastic": {"nodes": 2, "nodesFrom": "Trainer", "resizes": 4},
    }
    lost = LastResize(reasons.NODE_LOST, 2, 1, NOW.timestamp() - 5.0, 4.5, round=3)
    plan = _reconcile(previous, 2, 2, 1, _reading(1, lost, 1))
    elastic = plan.status["elastic"]
    assert (elastic["nodes"], elastic["resizes"], elastic["lastResize"]["reason"]) == (1, 5, "NodeLost")


RUNNING_AT_2: dict[str, Any] = {
    "phase": "Running",
    "attempt": 1,
    "elastic": {"nodes": 2, "nodesFrom": "Trainer", "resizes": 0},
}
"""A running elastic job whose trainer says its world is 2, before any resize (read, never changed)."""


def test_a_scale_counts_once_and_gets_its_cost_when_the_world_reaches_it() -> None:
    """spec.nodes 2 -> 3: counted Scaled when the Job is resized; the world's steps toward 3 (which the
    launchers record as a node joining) are that scale, not more resizes; reaching 3 writes its cost."""
    previous = RUNNING_AT_2
    plan = _reconcile(previous, 3, 2, 2, _reading(2))
    assert plan.resize_job == ("job-1", 3) and plan.status["elastic"]["resizes"] == 1
    assert plan.status["elastic"]["lastResize"]["reason"] == "Scaled"
    joined = LastResize(reasons.NODE_REJOINED, 2, 3, NOW.timestamp() - 4.0, 3.25, round=1)
    after = _reconcile({**previous, **plan.status}, 3, 3, 3, _reading(3, joined, 1))
    elastic = after.status["elastic"]
    assert (elastic["nodes"], elastic["resizes"]) == (3, 1), elastic
    assert elastic["lastResize"] == {
        **plan.status["elastic"]["lastResize"],
        "secondsLost": 3.2,
        "mode": "restarted",
    }
    assert not [e for e in after.events if e.reason == reasons.RESIZED]


def test_worlds_no_reading_saw_are_counted_once_each_and_a_new_attempt_counts_afresh() -> None:
    """A node goes silent, wakes and rejoins, then a node is lost and another joins, all between two
    readings (the operator read world 2 before and world 2 after): the launchers' records of the four
    rounds count four resizes, each once; the last is lastResize with its cost. The same records again
    count nothing. A new attempt's Job (its rounds start again) counts its own."""
    previous = RUNNING_AT_2
    at = NOW.timestamp()
    changes = (
        LastResize(reasons.NODE_SILENT, 2, 1, at - 60, None, round=1),
        LastResize(reasons.NODE_REJOINED, 1, 2, at - 40, None, round=2),
        LastResize(reasons.NODE_LOST, 2, 1, at - 30, None, round=3),
    )
    last = LastResize(reasons.NODE_REJOINED, 1, 2, at - 10, 6.0, round=4)
    plan = _reconcile(previous, 2, 2, 2, _reading(2, last, 4, changes))
    elastic = plan.status["elastic"]
    assert (elastic["nodes"], elastic["resizes"], elastic["counted"]) == (2, 4, {"job": "job-1", "round": 4})
    assert elastic["lastResize"]["reason"] == "NodeRejoined" and elastic["lastResize"]["secondsLost"] == 6.0
    said = [e.type for e in plan.events if e.reason == reasons.RESIZED]
    assert said == ["Warning", "Normal", "Warning", "Normal"], plan.events
    again = _reconcile({**previous, **plan.status}, 2, 2, 2, _reading(2, last, 4, changes))
    assert again.status["elastic"]["resizes"] == 4
    assert not [e for e in again.events if e.reason == reasons.RESIZED]
    other = job_object(2)  # attempt 2's Job: its launchers' round 1 is a change of its own
    other["spec"]["completions"] = other["spec"]["parallelism"] = 2
    body = ddpjob_body({**previous, **plan.status, "attempt": 2}, nodes=2, elastic=ELASTIC)
    first = LastResize(reasons.NODE_LOST, 2, 1, at - 2, 1.5, round=1)
    snapshot = live.record(
        None,
        2,
        9400,
        [],
        NOW.timestamp(),
        Progress(step=5, world_size=PROCS, changes=(first,), last_resize=first),
    )
    fresh = decision.decide(observed(body, [other], [pod_object(2, 0)], NOW, snapshot))
    assert fresh.status["elastic"]["resizes"] == 5, fresh.status["elastic"]
    assert fresh.status["elastic"]["counted"] == {"job": "job-2", "round": 1}


def test_until_the_trainer_says_its_world_nodes_are_the_pods_ready_and_its_first_word_is_no_resize() -> None:
    previous = {"phase": "Running", "attempt": 1}
    plan = _reconcile(previous, 3, 3, 3, None)
    elastic = plan.status["elastic"]
    assert (elastic["nodes"], elastic["nodesFrom"], elastic["resizes"]) == (3, "PodsReady", 0)
    first = _reconcile({**previous, **plan.status}, 3, 3, 3, _reading(2))  # 2 of 3 formed the first world
    elastic = first.status["elastic"]
    assert (elastic["nodes"], elastic["nodesFrom"], elastic["resizes"]) == (2, "Trainer", 0)
    # a moment with no answer (the metrics servers restart with a new world): the trainer's word is kept
    quiet = _reconcile({**previous, **first.status}, 3, 3, 3, _reading(None))
    assert (quiet.status["elastic"]["nodes"], quiet.status["elastic"]["nodesFrom"]) == (2, "Trainer")


def _served(stored: dict[str, Any], written: dict[str, Any]) -> dict[str, Any]:
    """The status as the API server gives it back after the runtime's merge patch of ``written`` onto
    ``stored`` (runtime/reconcile.py): the fields the CRD's status schema lacks pruned, and a JSON round trip
    as Go makes it (keys sorted, an integral number such as 3.0 back as 3)."""

    def patched(old: Any, patch: Any) -> Any:
        if not isinstance(patch, dict):
            return patch
        out = dict(old) if isinstance(old, dict) else {}
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = patched(out.get(key), value)
        return out

    def pruned(value: Any, node: dict[str, Any]) -> Any:
        if isinstance(value, dict) and "properties" in node:
            return {k: pruned(v, node["properties"][k]) for k, v in value.items() if k in node["properties"]}
        if isinstance(value, list) and "items" in node:
            return [pruned(v, node["items"]) for v in value]
        return value

    def go(value: Any) -> Any:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, dict):
            return {k: go(value[k]) for k in sorted(value)}
        return [go(v) for v in value] if isinstance(value, list) else value

    schema = crd.openapi_schema()["properties"]["status"]
    served: dict[str, Any] = json.loads(
        json.dumps(go(pruned(patched(stored, merge_patch(stored, written)), schema)))
    )
    return served


def test_two_scales_count_two_resizes_on_statuses_as_the_api_server_serves_them() -> None:
    """2 -> 3 -> 1 as tests/e2e/test_scale.py does it, each reconcile deciding from the status as the API
    server gives it back (pruned by the CRD, integral seconds as integers, keys sorted), the trainer's
    readings showing each change again and again: 2 resizes, the last Scaled to 1 with its cost."""
    at = NOW.timestamp()
    grown = LastResize(reasons.NODE_REJOINED, 2, 3, at - 30, 4.0, round=1)
    shrunk = LastResize(reasons.NODE_LOST, 3, 1, at - 10, 3.0, round=2)
    steps = [  # spec.nodes, the Job's size, pods ready, the reading
        (2, 2, 2, _reading(2)),
        (3, 2, 2, _reading(2)),  # kubectl scale: the Job resized
        (3, 3, 3, _reading(2)),
        *[(3, 3, 3, _reading(3, grown, 1))] * 3,
        (1, 3, 3, _reading(3, grown, 1)),  # kubectl scale
        *[(1, 1, 1, _reading(1, shrunk, 2, (grown,)))] * 3,
    ]
    status: dict[str, Any] = {"phase": "Running", "attempt": 1}
    for nodes, size, pods, snapshot in steps:
        status = _served(status, _reconcile(status, nodes, size, pods, snapshot).status)
    elastic = status["elastic"]
    assert (elastic["resizes"], elastic["counted"]) == (2, {"job": "job-1", "round": 2}), elastic
    assert elastic["lastResize"] == {
        "from": 3,
        "reason": "Scaled",
        "secondsLost": 3,
        "time": STAMP,
        "to": 1,
        "mode": "restarted",
    }
    typed = typed_status.read(status).elastic  # an integral number served as an int is still a number
    assert typed is not None and typed.last_resize is not None and typed.last_resize.seconds_lost == 3


def test_a_scale_seen_again_before_the_jobs_index_shows_the_resized_job_counts_once() -> None:
    """The reconcile after a scale's may find the Jobs index still showing the Job at its old size: the
    runtime's watch of the Jobs trails its own patch, and the DDPJob's status patch wakes the next reconcile
    as fast. The runtime hands that reconcile the Job its resize returned (runtime.recent: read your own
    writes), so the scale that the status already counts is neither resized, counted nor said again; once
    the index shows the resized Job, it is the truth again. Without it, the scale counted twice (test_scale
    on the test cluster: 4 resizes for 2 scales)."""
    memory, key, stale = Recent(), ("ns", "job"), _job(2)
    stale["metadata"] |= {"uid": "j1", "resourceVersion": "40"}

    def reconcile(status: dict[str, Any], nodes: int, indexed: dict[str, Any], pods: int) -> Plan:
        body = ddpjob_body(status, nodes=nodes, elastic=ELASTIC)
        running = [pod_object(1, i) for i in range(pods)]
        jobs = memory.jobs(key, [indexed], now=1.0)
        return decision.decide(observed(body, jobs, running, NOW, _reading(2)))

    previous = RUNNING_AT_2
    plan = reconcile(previous, 3, stale, 2)
    assert plan.resize_job == ("job-1", 3) and plan.status["elastic"]["resizes"] == 1
    resized = _job(3)  # what the patch of the Job returned: a later version of it
    resized["metadata"] |= {"uid": "j1", "resourceVersion": "41"}
    memory.job_patched(key, resized, now=1.0)
    again = reconcile({**previous, **plan.status}, 3, stale, 2)
    assert again.resize_job is None
    assert again.status["elastic"] == plan.status["elastic"]
    assert not [e for e in again.events if e.reason == reasons.RESIZED]
    # the index caught up: it is the truth again; a later scale back to 2 and up again counts each
    shown = _job(3)
    shown["metadata"] |= {"uid": "j1", "resourceVersion": "41"}
    down = reconcile({**previous, **again.status}, 2, shown, 3)
    assert memory.jobs(key, [stale], now=2.0) == [stale]  # forgotten once the index showed it
    up = reconcile({**previous, **down.status}, 3, stale, 2)
    assert (down.status["elastic"]["resizes"], up.status["elastic"]["resizes"]) == (2, 3)


def test_a_healed_grow_says_the_steps_it_lost_and_the_bytes_a_live_replica_sent() -> None:
    """The launchers' record of a world healed in place with what the heal cost (the trainer's gauges): the
    status's lastResize and the Resized event say the steps lost and the bytes sent; a restarted change
    says neither."""
    previous = {
        "phase": "Running",
        "attempt": 1,
        "elastic": {"nodes": 2, "nodesFrom": "Trainer", "resizes": 1},
    }
    grow = LastResize(
        reasons.NODE_REJOINED,
        2,
        3,
        NOW.timestamp() - 3.0,
        1.84,
        round=5,
        mode=reasons.HEALED,
        steps_lost=0,
        bytes_sent=82992,
    )
    plan = _reconcile(previous, 3, 3, 3, _reading(3, grow, 2))
    last = plan.status["elastic"]["lastResize"]
    assert (last["mode"], last["stepsLost"], last["bytesSent"], last["secondsLost"]) == (
        "healed",
        0,
        82992,
        1.8,
    )
    (event,) = [e for e in plan.events if e.reason == reasons.RESIZED]
    assert (
        "healed in place: the survivors kept their processes and state (0 step(s) lost, 82992 bytes of "
        "state sent)" in event.message
    ), event.message
    restarted = LastResize(reasons.NODE_REJOINED, 2, 3, NOW.timestamp() - 3.0, 4.0, round=5)
    plan = _reconcile(previous, 3, 3, 3, _reading(3, restarted, 2))
    assert not {"stepsLost", "bytesSent"} & set(plan.status["elastic"]["lastResize"]), plan.status
