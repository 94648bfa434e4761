"""The standby on a Lease (runtime/lease.py) against the real API server, with `ddpjob operator --lease` as
local processes: each authenticates as the chart's ServiceAccount with a token of its own, so the API
server's audit log tells their requests apart (``authentication.kubernetes.io/credential-id``).

Strict, with no grace window: after a SIGKILL of the holder, every write it made was received before the
standby's first write; a holder that stops cleanly (SIGTERM, as at a `helm upgrade` of the chart's
Recreate Deployment) releases the Lease and its standby takes over at its next read. The chart's own pods
do the same on real nodes (tests/e2e/test_real_nodes.py)."""

from __future__ import annotations

import base64
import datetime as dt
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_operator.runtime import lease
from helpers.e2e import Operator, children, session_operator_paused
from helpers.helmrelease import audit_events
from helpers.operator_process import OPERATOR_NAMESPACE, OPERATOR_USER, SERVICE_ACCOUNT, ddpjob
from testcluster import serviceaccounts
from testcluster.fixtures import Cluster, manifests, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

CREDENTIAL = "authentication.kubernetes.io/credential-id"
TAKEOVER_GOAL = 12 + 5  # seconds: today's 12 s bound, and the standby's Kopf start and first reconcile


def _writes(cluster: Cluster, tokens: set[str]) -> list[tuple[float, str, str]]:
    """(received, token, what) of every write made with one of ``tokens`` (credential ids: the cluster is
    shared, other sessions' operators write as the same ServiceAccount) but refused Lease writes, by when
    the API server received it."""
    out = []
    for event in audit_events(cluster, OPERATOR_USER):
        ref = event.get("objectRef") or {}
        token = ((event["user"].get("extra") or {}).get(CREDENTIAL) or ["?"])[0]
        if event["verb"] not in ("create", "update", "patch", "delete") or token not in tokens:
            continue
        when = dt.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
        code = (event.get("responseStatus") or {}).get("code", 0)
        if ref.get("resource") == "leases" and code >= 400:
            continue  # a candidate's refused take (409): not an acting replica's write
        out.append((when, token, f"{event['verb']} {ref.get('resource')} {ref.get('name', '')} {code}"))
    return sorted(out)


def _candidate(cluster: Cluster, tmp_path: Path, who: str, args: tuple[str, ...]) -> Operator:
    kubeconfig = serviceaccounts.write_kubeconfig(
        cluster.kube, cluster.layout, OPERATOR_NAMESPACE, SERVICE_ACCOUNT, tmp_path / f"{who}.kubeconfig"
    )
    return Operator(kubeconfig, tmp_path / f"{who}.log", args=args)


def _credential(operator: Operator) -> str:
    """The audit log's credential id of the token in ``operator``'s kubeconfig (``JTI=`` its jti claim)."""
    token = yaml.safe_load(operator.kubeconfig.read_text())["users"][0]["user"]["token"]
    payload = token.split(".")[1]
    return "JTI=" + json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["jti"]


def _holder(cluster: Cluster, name: str) -> dict[str, Any]:
    got: dict[str, Any] = cluster.kubectl_json("get", "lease", name, "-n", OPERATOR_NAMESPACE)
    return got["spec"]


def test_a_standby_takes_over_a_killed_holder_after_its_last_write_and_a_stopped_one_at_once(
    cluster: Cluster, operator: Operator, namespace: str, tmp_path: Path
) -> None:
    """(``operator``: the session's, which installed the CRD and the chart's RBAC; paused meanwhile.)"""
    name = f"standby-{uuid.uuid4().hex[:6]}"
    # cluster-wide, as the chart's default: with --namespace, Kopf lists namespaces first, which the chart's
    # account may not (forbidden, retried with back-off for about a minute before it falls back)
    args = (f"--lease={OPERATOR_NAMESPACE}/{name}",)
    with session_operator_paused():
        a, b = (_candidate(cluster, tmp_path, who, args) for who in ("a", "b"))
        c = None
        a.start()  # its /healthz is Kopf's: it holds the Lease (none there yet) and acts
        b.start()  # its /healthz is the standby's own
        try:
            wait_for(lambda: "standing by" in b.log.read_text(), what="b to stand by", timeout=30)
            assert "acquired the Lease" in a.log.read_text() and "acquired" not in b.log.read_text()
            cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifests(ddpjob("first")))
            (job,) = wait_for(
                lambda: children(cluster, namespace, "jobs", "first"), what="a's Job of first", timeout=60
            )
            # a dies without a word: its lease stays until b has seen it unrenewed for its duration
            assert a.process is not None
            a.process.kill()
            a.process.wait()
            killed = time.time()
            a.process = None
            cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifests(ddpjob("second")))
            wait_for(
                lambda: children(cluster, namespace, "jobs", "second"),
                what="b's Job of second",
                timeout=TAKEOVER_GOAL + 30,
                every=0.1,
            )
            taken = time.time()
            print(f"the standby created the second DDPJob's Job {taken - killed:.1f} s after the SIGKILL")
            assert taken - killed <= TAKEOVER_GOAL, f"took over {taken - killed:.1f} s after the kill"
            assert _holder(cluster, name)["leaseTransitions"] == 1

            # a third candidate stands by; b stops cleanly (SIGTERM) and releases: c takes over at once
            c = _candidate(cluster, tmp_path, "c", args)
            c.start()
            wait_for(lambda: "standing by" in c.log.read_text(), what="c to stand by", timeout=30)
            b.stop()
            stopped = time.time()
            assert "released the Lease" in b.log.read_text(), b.log.read_text()[-3000:]
            wait_for(
                lambda: "acquired the Lease" in c.log.read_text(),
                what="c to take over",
                timeout=15,
                every=0.1,
            )
            handed = time.time() - stopped
            print(f"the standby took over {handed:.1f} s after the holder stopped cleanly")
            assert handed < lease.LEASE_DURATION_SECONDS / 2, "released: not a lease duration's wait"
            cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifests(ddpjob("third")))
            wait_for(
                lambda: children(cluster, namespace, "jobs", "third"), what="c's Job of third", timeout=60
            )
            (still,) = children(cluster, namespace, "jobs", "first")
            assert still["metadata"]["uid"] == job["metadata"]["uid"], "the running job kept its Job"

            # strictly: each holder's writes all received before the next one's first write
            tokens = {op: _credential(op) for op in (a, b, c)}
            wait_for(lambda: _writes(cluster, {tokens[c]}), what="c's writes in the audit log")
            writes = _writes(cluster, set(tokens.values()))
            near = json.dumps([(round(w - killed, 3), t[-8:], what) for w, t, what in writes], indent=0)
            for old, new in ((a, b), (b, c)):
                last_old = max(w for w, t, _ in writes if t == tokens[old])
                first_new = min(w for w, t, _ in writes if t == tokens[new])
                assert last_old < first_new, f"{tokens[old]} wrote after {tokens[new]} first did: {near}"
            assert max(w for w, t, _ in writes if t == tokens[a]) < killed + 0.5, near
            # and b judged a's lease expired on its own clock: a whole duration after a's last renewal (its
            # last write to the Lease; a's other writes, events and status, may come later: the full run of
            # 2026-12-03 had an event 0.7 s after the renewal and b's take-over 10.3 s after the renewal)
            last_a = max(w for w, t, what in writes if t == tokens[a] and " leases " in f" {what} ")
            first_b = min(w for w, t, _ in writes if t == tokens[b])
            print(f"a's last renewal to b's first write: {first_b - last_a:.2f} s")
            assert first_b - last_a >= lease.LEASE_DURATION_SECONDS - 0.1, near
        finally:
            for op in (a, b, c):
                if op is not None:
                    op.stop()
            cluster.kubectl("delete", "ddpjob", "--all", "-n", namespace, "--wait=false", check=False)


def test_candidates_at_once_against_the_real_api_server_take_the_lease_once(
    cluster: Cluster, operator: Operator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six candidates try to take an absent Lease at the same moment, then (released) again: each time the
    API server lets exactly one write through (a create, then an update under the resourceVersion read)."""
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    name = f"race-{uuid.uuid4().hex[:6]}"
    candidates = [lease.Elector(OPERATOR_NAMESPACE, name, f"c{i}", duration=5, deadline=3) for i in range(6)]
    for round_ in ("absent", "released"):
        together = threading.Barrier(len(candidates))
        won: list[str] = []

        def take(candidate: lease.Elector, together: threading.Barrier, won: list[str]) -> None:
            together.wait()
            try:
                if candidate.try_acquire():
                    won.append(candidate.who)
            except Exception as exc:  # the refused ones: 409
                assert getattr(exc, "status", None) == 409, exc

        threads = [threading.Thread(target=take, args=(one, together, won)) for one in candidates]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert len(won) == 1, (round_, won)
        assert _holder(cluster, name)["holderIdentity"] == won[0]
        (winner,) = [one for one in candidates if one.who == won[0]]
        winner.release()
        assert not _holder(cluster, name).get("holderIdentity")
        for one in candidates:
            one.holding.clear()
            one.releasing.clear()
            one.seen = None
    cluster.kubectl("delete", "lease", name, "-n", OPERATOR_NAMESPACE)
