"""An elastic DDPJob loses the real node that runs rank 0 and trains on, then grows back when the node
returns (issue 42, items 3-5, in a cluster): the same Job and attempt, no restart spent, every world
verified. Before that, in the same run, rank 0's pod is cut off from the network while it runs (issue 54:
a silent peer, its sockets open) and comes back: the survivor trains on at one node within 30 s, and the
cut pod rejoins at a step boundary.

Two pods of one rank on ``real-1`` and ``real-2`` (a required spread). The rendezvous store is a Job of
its own (``<job>-1-rdzv``, with no placement of the workers': it runs on one of the process-tier nodes), so
the node lost is rank 0's (its kubelet and containerd stopped, as ``test_real_nodes``' lost node): the
node that would have hosted the rendezvous, and PyTorchJob's elastic mode's point of failure. The job heals
(issue 57: the built-in trainer's elastic job on gloo heals by default, nothing asked in its env): the
survivor's worker fails in a collective with its lost peer, its agent re-rendezvouses at one node (the
launcher counts it as a resize, not a restart) and the worker heals in place, in the same process and state
(nothing read back from storage), verifies and trains on; the operator keeps the attempt (``Running``,
``BelowDesired``). Once the node is back, the Job replaces the evicted pod, which joins at a step boundary and
takes its state from the survivor: two nodes again. The cut pod's silence is healed the same way. The store's
Job goes once the job ended."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import slow_factories
from helpers.e2e import SCRIPTS, Operator, children, events, get, newest_step, real_ddpjob, stores, wait_phase
from helpers.e2e_pods import cut_network, durable_job, pod_at
from testcluster import realfixture
from testcluster.fixtures import Cluster, wait_for
from testcluster.nodeconfig import RealNode

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SPREAD = {
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "shrink"}},
        }
    ]
}


def _ready(status: dict[str, Any]) -> dict[str, Any]:
    return {c["type"]: c for c in status.get("conditions", [])}.get("Ready", {})


def test_an_elastic_job_trains_on_without_a_lost_node_and_grows_back_when_it_returns(
    cluster: Cluster, operator: Operator, namespace: str, real_nodes: list[RealNode], tmp_path: Path
) -> None:
    folder = tmp_path / "ckpt"
    # the tests' slow MLP (30 ms a forward: a world of one, two forwards a step, would otherwise finish its
    # steps in a second, before the node is back); its module is in the scripts folder mounted in the pods
    trainer = {"steps": 2600, "batchSize": 16, "checkpointEvery": 20, "model": "slow_factories:slow_mlp"}
    gate = folder / "fast"  # opened once the world grew back to 2: its last steps at full speed
    doc = real_ddpjob(
        "shrink",
        **durable_job(folder, trainer=trainer),
        scripts=True,
        env=[
            {"name": "PYTHONPATH", "value": str(SCRIPTS)},
            {"name": slow_factories.FAST_AFTER_ENV, "value": str(gate)},  # the checkpoint folder: mounted
        ],
        elastic={"minNodes": 1, "maxNodes": 2},
        syncCheck={"everySteps": 100},
        maxRestarts=0,  # a resize must spend none
        nodeLostTolerationSeconds=10,
        podTemplate=SPREAD,
    )
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
    wait_for(lambda: list(folder.glob("step-*.pt")), what="a first checkpoint", timeout=300)
    rank0_node = pod_at(cluster, namespace, "shrink", 0)["spec"]["nodeName"]
    (lost,) = [n for n in real_nodes if n.name == rank0_node]
    (kept,) = [n for n in real_nodes if n.name != rank0_node]
    assert pod_at(cluster, namespace, "shrink", 1)["spec"]["nodeName"] == kept.name
    (store,) = stores(cluster, namespace, "pods", "shrink")
    assert store["spec"]["nodeName"] not in (lost.name, kept.name), store["spec"]  # no worker's node

    job_uid = children(cluster, namespace, "jobs", "shrink")[0]["metadata"]["uid"]
    _cut_off_and_back(cluster, namespace, real_nodes)
    survivor_name = pod_at(cluster, namespace, "shrink", 1)["metadata"]["name"]
    grown_before = _log(cluster, namespace, survivor_name).count(GROWN)
    try:
        realfixture.lose_node(lost)

        def trains_at_one() -> dict[str, Any] | None:
            status: dict[str, Any] = get(cluster, namespace, "shrink")["status"]
            return status if _ready(status).get("reason") == "BelowDesired" else None

        below = wait_for(trains_at_one, what="Running at 1 of 2 nodes (BelowDesired)", timeout=180, every=0.5)
        assert below["phase"] == "Running" and below["attempt"] == 1, below
        saved = newest_step(folder)  # the trainer keeps only the newest few: compare steps, not counts
        try:
            wait_for(
                lambda: newest_step(folder) > saved,
                what=f"a checkpoint past step {saved} written by the world of one node",
                timeout=180,
            )
        except AssertionError as exc:
            survivor = pod_at(cluster, namespace, "shrink", 1)["metadata"]["name"]
            said = _told(_log(cluster, namespace, survivor))
            raise AssertionError(f"{exc}\n{survivor}'s log:\n{said}") from None
        # back only once its pod was evicted (DisruptionTarget, past nodeLostTolerationSeconds): the Job then
        # replaces it; a node back sooner finds its containers killed (137), a crash like any other
        wait_for(
            lambda: any(
                c.get("type") == "DisruptionTarget" and c.get("status") == "True"
                for p in children(cluster, namespace, "pods", "shrink")
                if p["spec"].get("nodeName") == lost.name
                for c in p["status"].get("conditions", [])
            ),
            what=f"the pod on {lost.name} evicted from the lost node",
            timeout=120,
        )
    finally:
        realfixture.restore_node(cluster, lost)

    def grown_back_or_ended() -> bool:
        ended = get(cluster, namespace, "shrink").get("status", {}).get("phase") in ("Succeeded", "Failed")
        return ended or _log(cluster, namespace, survivor_name).count(GROWN) > grown_before

    # the slow pace was for the lost node's return: once the world is 2 again, the rest at full speed
    returned = time.monotonic()
    wait_for(grown_back_or_ended, what="the world grown back to 2 once the node returned", timeout=300)
    gate.touch()
    print(f"the node back → the world of 2 again (or the end): {time.monotonic() - returned:.0f} s")
    final = wait_phase(cluster, namespace, "shrink", "Succeeded", "Failed", timeout=600)["status"]
    print(f"the node back → {final['phase']}: {time.monotonic() - returned:.0f} s")
    if final["phase"] != "Succeeded":
        logs = [
            cluster.kubectl("logs", "-n", namespace, p["metadata"]["name"], check=False)
            for p in children(cluster, namespace, "pods", "shrink")
        ]
        tails = "\n---\n".join(_told(r.stdout + r.stderr, 4000) for r in logs)
        raise AssertionError(f"{final.get('conditions')}\n{final.get('lastReport')}\n{tails}")
    assert final["sync"]["verified"] is True, final
    assert (final["attempt"], final.get("restarts", 0)) == (1, 0), final
    assert [j["metadata"]["uid"] for j in children(cluster, namespace, "jobs", "shrink")] == [job_uid]
    resized = [e.get("message", "") for e in events(cluster, namespace, "shrink", "Resized")]
    survivor, replacement = (
        _log(cluster, namespace, pod_at(cluster, namespace, "shrink", i)["metadata"]["name"]) for i in (1, 0)
    )
    # every resize counted, once (issue 54 item 6): the survivor was in every world of the attempt, so its
    # launcher's world changes are all of them (the cut's shrink and rejoin, the lost node's shrink and
    # regrow), though the operator read some of those worlds never (a rejoin within seconds; readings that
    # failed while the lost node's pod did not answer)
    changes = re.findall(r"the world changed from (\d+) to (\d+) node\(s\)", survivor)
    counted = final["elastic"].get("resizes")
    print(f"resizes counted: {counted}, the survivor's world changes: {changes}, Resized events: {resized}")
    assert counted == len(changes) >= 2, (counted, changes, resized)
    assert any("NodeSilent" in message for message in resized), resized
    assert "the world changed from 2 to 1 node(s) (elastic): no restart spent" in survivor, survivor[-3000:]
    shrunk = [int(w) for w in re.findall(r"elastic: world size (\d+) verified at step", survivor)]
    grown = [int(w) for w in re.findall(r"elastic: world size (\d+) verified at step", replacement)]
    assert 1 in shrunk and (2 in grown or shrunk[-1] == 2), (shrunk, grown, survivor[-3000:])  # 1 → 2
    # issue 57: each world change healed in place (the default): the survivor's workers kept their
    # processes and state through the cut, the loss and both returns (no restart, no checkpoint read back),
    # and the replacement took its state from the survivor over the process group
    assert survivor.count("healed in place into round") == len(changes), _told(survivor)
    assert "restored step-" not in survivor and "gang restart in place" not in survivor, _told(survivor)
    assert resized and all("healed in place" in message for message in resized), resized
    assert "joined a world that heals in place: state of step" in replacement, _told(replacement)
    # the operator deletes the store Job when the job ends (a late pod would have found it until then)
    wait_for(
        lambda: not stores(cluster, namespace, "jobs", "shrink"),
        what="the rendezvous store's Job deleted once the job ended",
        timeout=60,
    )


GROWN = "the world changed from 1 to 2 node(s) (elastic): no restart spent"
"""The survivor's launcher, as the cut pod joins again (rank 0 of the world of 2 is the cut pod's: it
orders first, and only rank 0 logs the world's size)."""
VERIFIED_AT_2 = "elastic: world size 2 verified at step"
"""Rank 0's line once a world of 2 holds its state and passed its check (only rank 0 logs it)."""
SILENT_BOUND_SECONDS = 30.0
"""Issue 54's bound: from a node going silent to the survivors' first step at the smaller world."""


def _cut_off_and_back(cluster: Cluster, namespace: str, real_nodes: list[RealNode]) -> None:
    """Rank 0's pod cut off from the network (every packet of its network namespace dropped), its processes
    running, its sockets open and its node Ready: no collective of the survivor fails, but its agent sees
    the cut pod's rendezvous keep-alive stop and the survivor trains on at one node within the bound. The
    network back, the cut pod leaves its stale world (its agent finds itself dropped, or its workers'
    collective with the dead peer fails, whichever comes first), writes no checkpoint in it, and joins at a
    step boundary like any new node: two nodes again, in the same attempt."""
    cut = pod_at(cluster, namespace, "shrink", 0)
    survivor = pod_at(cluster, namespace, "shrink", 1)["metadata"]["name"]
    grown_before = _log(cluster, namespace, survivor).count(GROWN)
    pods = (cut["metadata"]["name"], survivor)

    def verified_at_2() -> int:  # rank 0 says it: the cut pod's, as it orders first (either, to be sure)
        return sum(_log(cluster, namespace, pod).count(VERIFIED_AT_2) for pod in pods)

    verified_before = verified_at_2()
    cut_at, cut_wall = time.monotonic(), time.time()
    with cut_network(real_nodes, cut):
        wait_for(
            lambda: "elastic: world size 1 verified" in _log(cluster, namespace, survivor),
            what=f"the survivor training at one node within {SILENT_BOUND_SECONDS:.0f} s of the cut",
            timeout=SILENT_BOUND_SECONDS,
            every=0.5,
        )
        shrunk_in = time.monotonic() - cut_at
    print(f"network cut → world of 1 verified: {shrunk_in:.1f} s (bound {SILENT_BOUND_SECONDS:.0f} s)")
    said = _log(cluster, namespace, survivor)
    assert "went silent: no keep-alive for" in said, said[-3000:]
    cut_name = cut["metadata"]["name"]
    try:
        # the cut pod leaves its stale world one of two ways, whichever comes first once its network is
        # back: its agent finds itself dropped from the round, or its workers' collective with the dead
        # peer fails (the peer's reset arrives); either way it joins the next round like any new node
        wait_for(
            lambda: _log(cluster, namespace, survivor).count(GROWN) > grown_before,
            what="a world of 2 again once the cut pod rejoined",
            timeout=180,
            every=1,
        )
        regrown_wall = time.time()
        # the next drill loses this world's rank 0 once the world trains, not while its workers start: a node
        # lost in that window has left the survivor's worker waiting to connect to the dead rank 0's store
        # (twice in 7 runs, CI included; issue 54's notes), a case of its own that this drill does not prove
        wait_for(
            lambda: verified_at_2() > verified_before,
            what="the world of 2 verified by its rank 0",
            timeout=120,
            every=1,
        )
    except AssertionError as exc:
        tails = {name: _told(_log(cluster, namespace, name)) for name in (cut_name, survivor)}
        raise AssertionError(f"{exc}\n" + "\n".join(f"--- {k}:\n{v}" for k, v in tails.items())) from None
    assert pod_at(cluster, namespace, "shrink", 0)["metadata"]["uid"] == cut["metadata"]["uid"]  # same pod
    # no checkpoint written by the stale world (issue 54 item 2): between the cut (a second's grace for a
    # save of the step the two finished together) and the cut pod's first world of 2 after it, it saved none
    said = _log(cluster, namespace, cut_name)
    rejoined = [at for at, line in _stamped(said) if at > cut_wall and VERIFIED_AT_2 in line]
    until = rejoined[0] if rejoined else regrown_wall
    stale = [line for at, line in _stamped(said) if cut_wall + 1.0 < at < until and SAVED in line]
    assert not stale, ("checkpoints saved by the cut pod's stale world", stale, _told(said))
    dropped = "this node was dropped from its round as silent" in said
    left = "found itself dropped" if dropped else "left when its collective failed"
    print(f"the cut pod {left}; it saved no checkpoint until it rejoined")


SAVED = ": checkpoint saved to "
"""Rank 0's line for each checkpoint it writes (the built-in trainer)."""


def _stamped(log: str) -> list[tuple[float, str]]:
    """The log's lines that start with the trainer's and launcher's time stamp (``contract.log_stamp``: local
    time), with that time as a Unix time."""
    found = []
    for line in log.splitlines():
        try:
            at = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1000
        except ValueError:
            continue
        found.append((at, line))
    return found


def _told(log: str, keep: int = 8000) -> str:
    """A log as a failure message shows it: C++ stack frames (``frame #N: …``, dozens of lines a torch
    error) left out, so the lines around them fit, then its last ``keep`` characters."""
    return "\n".join(line for line in log.splitlines() if not line.lstrip().startswith("frame #"))[-keep:]


def _log(cluster: Cluster, namespace: str, pod: str) -> str:
    said = cluster.kubectl("logs", "-n", namespace, pod, check=False)
    return said.stdout + said.stderr
