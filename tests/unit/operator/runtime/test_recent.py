"""Read your own writes (ddp_operator.runtime.recent): a reconcile that runs before the watches have shown the
operator its own status patch or its new Job decides from what it wrote, not from the stale index."""

from __future__ import annotations

import datetime as dt
from typing import Any

from ddp_operator.decide import decision
from ddp_operator.runtime import recent
from ddp_operator.runtime.recent import Recent
from helpers.reconciling import observed

KEY = ("ns", "job")
NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)


def body(version: str, uid: str = "u1", **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ddpjob.io/v1alpha1",
        "kind": "DDPJob",
        "metadata": {
            "name": "job",
            "namespace": "ns",
            "uid": uid,
            "resourceVersion": version,
            "generation": 1,
        },
        "spec": {"nodes": 1, "procsPerNode": 1, "device": "cpu", "suspend": True},
        **({"status": status} if status else {}),
    }


def job(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "7"}}


def test_the_body_our_status_patch_returned_wins_until_the_index_catches_up() -> None:
    memory = Recent()
    stale = body("10")
    assert memory.body(KEY, stale) is stale  # nothing written yet
    memory.patched(KEY, body("12", phase="Suspended"))
    assert memory.body(KEY, stale)["status"] == {"phase": "Suspended"}
    assert memory.body(KEY, body("11"))["metadata"]["resourceVersion"] == "12"  # an event between
    caught_up = body("12", phase="Suspended")
    assert memory.body(KEY, caught_up) is caught_up
    assert memory.body(KEY, stale) is stale  # once the index has caught up, it is the truth again


def test_a_newer_write_by_someone_else_wins() -> None:
    memory = Recent()
    memory.patched(KEY, body("12", phase="Suspended"))
    edited = body("15", phase="Running")
    assert memory.body(KEY, edited) is edited


def test_a_recreated_ddpjob_of_the_same_name_is_not_confused_with_the_old_one() -> None:
    memory = Recent()
    memory.patched(KEY, body("30", uid="old", phase="Failed"))
    fresh = body("20", uid="new")
    assert memory.body(KEY, fresh) is fresh


def test_versions_that_are_not_integers_leave_the_index_in_charge() -> None:
    assert not recent.newer(body("abc"), body("1"))
    assert not recent.newer(body("2"), body("xyz"))
    assert recent.newer(body("10"), body("9"))  # integers, not strings: "10" < "9" as text


def test_a_created_job_counts_until_the_index_shows_it_or_we_delete_it() -> None:
    memory = Recent()
    memory.created(KEY, job("job-1"), now=100.0)
    assert [j["metadata"]["name"] for j in memory.jobs(KEY, [], now=101.0)] == ["job-1"]
    indexed = [job("job-1")]
    assert memory.jobs(KEY, indexed, now=102.0) == indexed
    assert memory.jobs(KEY, [], now=103.0) == []  # seen once: from now on the index alone says
    memory.created(KEY, job("job-2"), now=104.0)
    memory.deleted(KEY, "job-2")
    assert memory.jobs(KEY, [], now=105.0) == []


def test_a_created_job_the_index_never_shows_is_forgotten_after_a_while() -> None:
    memory = Recent()
    memory.created(KEY, job("job-1"), now=0.0)
    assert memory.jobs(KEY, [], now=recent.JOB_MEMORY_SECONDS - 1)
    assert memory.jobs(KEY, [], now=recent.JOB_MEMORY_SECONDS + 1) == []


def test_a_patched_job_wins_while_it_is_newer_than_the_index() -> None:
    """An elastic job's resize (or a suspend): the Job our patch returned, until the index shows it (or
    someone else's later write), or for JOB_MEMORY_SECONDS at most; a Job we delete is forgotten."""
    memory = Recent()
    stale = {"metadata": {"name": "job-1", "uid": "j", "resourceVersion": "7"}, "spec": {"parallelism": 2}}
    mine = {"metadata": {"name": "job-1", "uid": "j", "resourceVersion": "9"}, "spec": {"parallelism": 3}}
    memory.job_patched(KEY, mine, now=0.0)
    assert memory.jobs(KEY, [stale], now=1.0) == [mine]
    assert memory.jobs(KEY, [stale], now=recent.JOB_MEMORY_SECONDS + 1) == [stale]  # forgotten
    memory.job_patched(KEY, mine, now=0.0)
    later = {**stale, "metadata": {**stale["metadata"], "resourceVersion": "12"}}
    assert memory.jobs(KEY, [later], now=1.0) == [later]  # the index moved past us
    assert memory.jobs(KEY, [stale], now=1.0) == [stale]  # and it is the truth from then on
    memory.job_patched(KEY, mine, now=0.0)
    memory.deleted(KEY, "job-1")
    assert memory.jobs(KEY, [stale], now=1.0) == [stale]


def test_forget_drops_everything_of_a_deleted_ddpjob() -> None:
    memory = Recent()
    memory.patched(KEY, body("12", phase="Suspended"))
    memory.created(KEY, job("job-1"), now=0.0)
    memory.forget(KEY)
    stale = body("10")
    assert memory.body(KEY, stale) is stale and memory.jobs(KEY, [], now=1.0) == []


def test_deciding_from_the_remembered_writes_repeats_nothing() -> None:
    """The bug it fixes: reconciles from the stale index planned the creation again, moved ``startTime``
    and repeated the transition events; from the remembered writes each step happens once."""
    first = decision.decide(observed(body("10"), [], [], NOW))
    assert first.create_job is not None and first.events
    later = NOW + dt.timedelta(seconds=1)
    # the stale view: everything is planned again
    again = decision.decide(observed(body("10"), [], [], later))
    assert again.create_job is not None and again.status["startTime"] != first.status["startTime"]

    memory = Recent()
    memory.patched(KEY, {**body("11"), "status": first.status})
    created = {**first.create_job, "metadata": {**first.create_job["metadata"], "resourceVersion": "11"}}
    memory.created(KEY, created, now=0.0)
    second = decision.decide(observed(memory.body(KEY, body("10")), memory.jobs(KEY, [], now=1.0), [], later))
    assert second.create_job is None and second.create_service is None
    assert second.status["startTime"] == first.status["startTime"]
    assert second.status["phase"] == "Suspended"  # the Job is there now: suspended, said once
    memory.patched(KEY, {**body("12"), "status": second.status})
    third = decision.decide(observed(memory.body(KEY, body("10")), memory.jobs(KEY, [], now=2.0), [], later))
    assert third.status == second.status and not third.events and third.create_job is None
