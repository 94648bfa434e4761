"""A DDPJob whose command is a user's torchrun script with no ddpjob code
(tests/helpers/no_code_train.py), on the
real control plane: the operator's init container puts the sync hook on the pods' PYTHONPATH
(spec.syncCheck.autoInstrument, on by default), and the DDPJob shows SYNC and PROGRESS as for the built-in
trainer — live from the pods' metrics while it runs, and from rank 0's report at the end."""

from __future__ import annotations

import json
from typing import Any

import pytest

from helpers.e2e import SCRIPTS, Operator, children, get, real_ddpjob, wait_phase
from testcluster.fixtures import Cluster, wait_for
from testcluster.nodeconfig import RealNode

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
STEPS = 1500
EVERY = 150
PROBE = 1000  # the compute probe (spec.syncCheck.probeEverySteps), which runs after a check of its own


def test_a_script_with_no_ddpjob_code_shows_sync_and_progress(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode]
) -> None:
    doc = real_ddpjob(
        "nocode",
        scripts=True,
        command=["torchrun"],
        args=[str(SCRIPTS / "no_code_train.py")],
        env=[{"name": "STEPS", "value": str(STEPS)}, {"name": "STEP_SECONDS", "value": "0.02"}],
        syncCheck={"everySteps": EVERY, "probeEverySteps": PROBE},
        maxRestarts=0,
    )
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
    jobs = wait_for(
        lambda: children(cluster, namespace, "jobs", "nocode") or None, what="the Job", timeout=60
    )
    (job,) = jobs
    (init,) = job["spec"]["template"]["spec"]["initContainers"]
    assert init["command"][:3] == ["python", "-m", "ddp_trainer.inject"], init

    last: list[dict[str, Any]] = []

    def live() -> dict[str, Any] | None:
        status: dict[str, Any] = get(cluster, namespace, "nocode").get("status", {})
        last[:] = [status]
        running = status.get("phase") == "Running" and status.get("progress", {}).get("step", 0) > 0
        return status if running and status.get("sync", {}).get("checks", 0) >= 2 else None

    mid = wait_for(
        live, what="status.progress.step > 0 and 2 sync checks while Running", timeout=180, every=1
    )
    print(f"status mid-run: {json.dumps({k: mid[k] for k in ('phase', 'progress', 'sync')})}")
    assert mid["progress"]["stepsPerSecond"] > 0, mid
    assert mid["sync"]["verified"] is True and mid["sync"]["lastCheckStep"] % EVERY == 0, mid
    table = cluster.kubectl("get", "ddpj", "nocode", "-n", namespace).stdout
    print(table)
    header, row = (line.split() for line in table.strip().splitlines())
    assert row[header.index("SYNC")] == "true", table
    assert row[header.index("PROGRESS")] not in ("", "<none>"), table

    done = wait_phase(cluster, namespace, "nocode", "Succeeded", "Failed", timeout=420)["status"]
    if done["phase"] != "Succeeded":  # say why: the pods' last lines (torch's abort at exit is retried once)
        pods = [p["metadata"]["name"] for p in children(cluster, namespace, "pods", "nocode")]
        tails = [cluster.kubectl("logs", "-n", namespace, pod, check=False).stdout[-2000:] for pod in pods]
        raise AssertionError(f"{done}\n" + "\n".join(tails))
    # the initial check, every EVERY steps (the last at the last step), one before each probe off that grid
    checks = 1 + STEPS // EVERY + sum(1 for step in range(PROBE, STEPS + 1, PROBE) if step % EVERY)
    assert done["sync"]["verified"] is True and done["sync"]["checks"] == checks, done
    assert done["sync"]["lastCheckStep"] == STEPS, done


def test_a_crash_in_a_users_script_is_blamed_on_the_rank_that_crashed(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode]
) -> None:
    """Rank 1 raises; rank 0 then fails in its next collective ("Connection closed by peer"). The DDPJob's
    status and Events name rank 1 and its own error, in a user's words, not rank 0's consequence."""
    doc = real_ddpjob(
        "crashes",
        scripts=True,
        command=["torchrun"],
        args=[str(SCRIPTS / "no_code_train.py")],
        env=[
            {"name": "STEPS", "value": "400"},
            {"name": "STEP_SECONDS", "value": "0.02"},
            {"name": "CRASH_AT", "value": "1,30"},
        ],
        maxRestarts=0,
    )
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
    done = wait_phase(cluster, namespace, "crashes", "Succeeded", "Failed", timeout=300)["status"]
    cause = "rank 1 failed first, in your command: RuntimeError: injected crash on rank 1 at step 30"
    failed = next(c for c in done["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and cause in failed["message"], done
    assert 1 in {f["rank"] for f in done["lastReport"]["failures"]}, done  # kept past the pods' deletion

    def naming() -> list[str] | None:  # Kopf posts events after the status, in the background
        events = cluster.kubectl_json(
            "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=crashes"
        )["items"]
        messages = [str(e.get("message", "")) for e in events]
        return messages if any(cause in m for m in messages) else None

    wait_for(naming, what="an Event naming rank 1's own error", timeout=30, every=1)


def test_a_script_that_builds_no_ddp_model_says_there_is_nothing_to_verify(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode]
) -> None:
    doc = real_ddpjob(
        "noddp",
        scripts=True,
        command=["torchrun"],
        args=[str(SCRIPTS / "no_code_train.py")],
        env=[
            {"name": "STEPS", "value": "40"},
            {"name": "STEP_SECONDS", "value": "0"},
            {"name": "NO_DDP", "value": "1"},
        ],
        maxRestarts=0,
    )
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
    done = wait_phase(cluster, namespace, "noddp", "Succeeded", "Failed", timeout=240)["status"]
    assert done["phase"] == "Succeeded", done
    sync = next(c for c in done["conditions"] if c["type"] == "SyncVerified")
    assert (sync["status"], sync["reason"]) == ("Unknown", "NoDDPModel"), done
    assert sync["message"] == "no DDP model was built in any rank: nothing to verify", done
