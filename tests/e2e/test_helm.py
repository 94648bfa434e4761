"""`helm install` for real: the chart on the test control plane, its operator Deployment's pod run from the
operator image by a real node's kubelet (in-cluster config: the projected ServiceAccount token and CA, the
`kubernetes` Service's address), a representative run of DDPJobs reconciled by it (their pods on the real
nodes too), then what that run proves about security (the RBAC verbs it used against the ones the chart
grants, from the API server's audit log; no secret in a log line or an Event; trainer pods non-root without
a token), and finally `helm upgrade` with every monitoring value on (the Prometheus Operator's real CRDs
schema-check the objects) and
`helm uninstall`, after which nothing of the release is left but the CRDs.

The release watches one namespace (``watchNamespaces``); the session's cluster-wide operator of the other
e2e tests is paused meanwhile (two must not reconcile the same DDPJobs)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.e2e import (
    ON_REAL_NODES,
    children,
    get,
    kubelet_volumes,
    real_ddpjob,
    wait_phase,
    writable_folder,
)
from helpers.helmrelease import (
    CRDS,
    Release,
    audit_events,
    granted_permissions,
    installed,
    prometheus_operator_crds,
    used_permissions,
)
from testcluster import kueue
from testcluster.fixtures import Cluster, host_path_volume, wait_for
from testcluster.nodeconfig import RealNode

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# Granted by the chart, not used by the representative run below, and why each is still needed.
NOT_EXERCISED: dict[tuple[str, str, str], str] = {
    # The operator's own ticker replaced Kopf's timer, so no finalizer is written on a DDPJob any more. Kopf
    # still patches a DDPJob to remove the finalizer an older operator left on it (an upgrade), and its own
    # annotations when a handler must retry; a fresh run with handlers that succeed does neither.
    ("ddpjob.io", "ddpjobs", "patch"): "Kopf removes an older operator's finalizer; a handler's retry state",
}


@dataclass
class Run:
    """What the representative run left for the tests to read."""

    release: Release
    nodes: list[RealNode]
    secret_value: str
    operator_pod: dict[str, Any]
    trainer_pods: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


def _apply(cluster: Cluster, namespace: str, doc: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))


def _representative_run(cluster: Cluster, release: Release, folder: Path) -> tuple[str, list[dict[str, Any]]]:
    """The operator's paths: a trained job with a checkpoint claim and a secret env var, a job with a
    ConfigMap's variables (neither read by the operator: the chart's default grants no access to Secrets or
    ConfigMaps, and only their pods' kubelet reads them), a gang restart then a TTL deletion, a suspension,
    a Job the API server refuses; returns the secret's value and the trained job's pods."""
    ns = release.jobs
    secret_value = secrets.token_hex(16)
    cluster.kubectl(
        "create", "secret", "generic", "trainer-credentials", "-n", ns, f"--from-literal=token={secret_value}"
    )
    storage_class = f"ckpt-{ns}"
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(host_path_volume(storage_class, storage_class, str(writable_folder(folder)))),
    )
    secret_env = {
        "name": "API_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "trainer-credentials", "key": "token"}},
    }
    trained = real_ddpjob(
        "trained",
        trainer={"steps": 30, "batchSize": 16, "checkpointEvery": 10},
        syncCheck={"everySteps": 10},
        checkpoint={"volumeClaimTemplate": {"storageClassName": storage_class, "size": "1Gi"}},
        env=[secret_env],
        elastic={"minNodes": 1, "maxNodes": 2},  # its rendezvous store: a Job created and deleted
    )
    fail_once = (
        "import os, sys; "
        "sys.exit(3 if (os.environ['DDPJOB_ATTEMPT'], os.environ['NODE_RANK']) == ('1', '1') else 0)"
    )
    flaky = real_ddpjob("flaky", ttlSecondsAfterFinished=1, command=["python", "-c", fail_once])
    cluster.kubectl("create", "configmap", "trainer-settings", "-n", ns, "--from-literal=LOG_LEVEL=info")
    settings = [{"configMapRef": {"name": "trainer-settings"}}]  # read by the kubelet, never the operator
    paused = real_ddpjob("paused", command=["python", "-c", "import time; time.sleep(600)"], envFrom=settings)
    # a label value Kubernetes refuses on the Job: the operator deletes the Service it created before it
    refused = real_ddpjob("refused", podTemplate={"labels": {"team": "a b"}})
    for doc in (trained, flaky, paused, refused):
        _apply(cluster, ns, doc)
    wait_phase(cluster, ns, "refused", "Failed", timeout=120)
    assert not children(cluster, ns, "services", "refused"), "the refused DDPJob kept its Service"
    wait_phase(cluster, ns, "paused", "Running", timeout=180)
    cluster.kubectl("patch", "ddpjob", "paused", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_phase(cluster, ns, "paused", "Suspended", timeout=60)
    status = wait_phase(cluster, ns, "trained", "Succeeded", "Failed", timeout=300)["status"]
    assert status["phase"] == "Succeeded" and status["sync"]["verified"] is True, status
    wait_for(
        lambda: (
            not cluster.kubectl_json("get", "ddpjobs", "-n", ns, "--field-selector", "metadata.name=flaky")[
                "items"
            ]
        ),
        what="DDPJob flaky to restart once, succeed and be deleted after its TTL",
        timeout=240,
        every=0.5,
    )
    return secret_value, children(cluster, ns, "pods", "trained")


@pytest.fixture(scope="module")
def run(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory, real_nodes: list[RealNode]
) -> Iterator[Run]:
    # Kueue's CRDs installed (not its controller), as on a cluster that queues: the operator then watches
    # Workloads (list, watch), a permission the chart grants and the audit comparison below checks.
    kueue.install_crds(cluster.layout)
    with installed(cluster, "helm", **ON_REAL_NODES) as release:
        operator_pod = release.operator_pod()
        secret_value, trainer_pods = _representative_run(cluster, release, tmp_path_factory.mktemp("pv"))
        events = [
            *cluster.kubectl_json("get", "events", "-n", release.jobs)["items"],
            *cluster.kubectl_json("get", "events", "-n", release.namespace)["items"],
        ]
        try:
            yield Run(release, real_nodes, secret_value, operator_pod, trainer_pods, events)
        finally:
            cluster.kubectl("delete", "pv", f"ckpt-{release.jobs}", "--wait=false", check=False)


def test_the_installed_operator_pod_reconciles_with_its_in_cluster_token(cluster: Cluster, run: Run) -> None:
    pod = run.operator_pod
    (container,) = pod["spec"]["containers"]
    assert container["image"].startswith("ddpjob/operator:") and "command" not in container  # ENTRYPOINT
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts[SERVICE_ACCOUNT_DIR]["readOnly"] is True, mounts  # added by the API server's admission
    user = f"system:serviceaccount:{run.release.namespace}:{run.release.service_account}"
    events = audit_events(cluster, user)
    status_patches = [
        e
        for e in events
        if e["verb"] == "patch" and (e.get("objectRef") or {}).get("subresource") == "status"
    ]
    assert status_patches, f"no status patch by {user} in the audit log"
    for event in status_patches:  # the pod-bound token the kubelet projected, not a kubeconfig's
        extra = event["user"].get("extra") or {}
        assert extra.get("authentication.kubernetes.io/pod-name") == [pod["metadata"]["name"]], event["user"]
    log = cluster.logs(run.release.namespace, pod["metadata"]["name"])
    assert "creating Job trained-1" in log, log[-3000:]


def test_the_chart_grants_only_what_the_operator_uses(cluster: Cluster, run: Run) -> None:
    user = f"system:serviceaccount:{run.release.namespace}:{run.release.service_account}"
    events = audit_events(cluster, user)
    refused = [
        (e["verb"], e.get("objectRef"), e["requestURI"]) for e in events if e["responseStatus"]["code"] == 403
    ]
    assert not refused, f"the operator was refused: {refused}"
    roles = [  # the ClusterRoles, and the Role of its Lease in its own namespace
        *cluster.kubectl_json("get", "clusterroles", "-l", run.release.selector)["items"],
        *cluster.kubectl_json("get", "roles", "-n", run.release.namespace, "-l", run.release.selector)[
            "items"
        ],
    ]
    rules = [rule for role in roles for rule in role.get("rules") or []]
    granted, used = granted_permissions(rules), used_permissions(events)
    unused = granted - used - set(NOT_EXERCISED)
    assert not unused, (
        f"granted but never used by the run (drop them, or say in NOT_EXERCISED why): {sorted(unused)}"
    )
    assert not used - granted, sorted(used - granted)
    assert not set(NOT_EXERCISED) & used, "NOT_EXERCISED names a permission the run did use"


def test_the_operator_reads_no_secret_or_configmap_by_default(cluster: Cluster, run: Run) -> None:
    """The chart's default (checkReferences.namespaces empty): no Role or ClusterRole of the release names
    Secrets or ConfigMaps, and the audit log holds not one request of the operator's for either (none read,
    none refused), though the run's DDPJobs name a Secret and a ConfigMap; its log says at start that
    references are checked from the kubelet's reasons only."""
    user = f"system:serviceaccount:{run.release.namespace}:{run.release.service_account}"
    events = audit_events(cluster, user)
    assert events, f"no request by {user} in the audit log"
    touched = [
        (e["verb"], e.get("objectRef"), e["responseStatus"]["code"])
        for e in events
        if (e.get("objectRef") or {}).get("resource") in ("secrets", "configmaps")
    ]
    assert not touched, f"the operator asked for Secrets or ConfigMaps: {touched}"
    roles = [
        *cluster.kubectl_json("get", "clusterroles", "-l", run.release.selector)["items"],
        *cluster.kubectl_json("get", "roles", "-A", "-l", run.release.selector)["items"],
    ]
    named = [
        r["metadata"]["name"]
        for r in roles
        for rule in r.get("rules") or []
        if {"secrets", "configmaps"} & set(rule["resources"])
    ]
    assert not named, f"roles of the release that grant Secrets or ConfigMaps: {named}"
    log = cluster.logs(run.release.namespace, run.operator_pod["metadata"]["name"])
    assert "checked from the kubelet's reasons only" in log, log[-3000:]


def test_no_token_or_secret_in_logs_events_or_status(cluster: Cluster, run: Run) -> None:
    pod = run.operator_pod
    folder = kubelet_volumes(run.nodes, pod)
    tokens = [p.read_text() for p in folder.glob("*/*/token")]
    assert tokens, f"the kubelet wrote no ServiceAccount token under {folder}"
    log = cluster.logs(run.release.namespace, pod["metadata"]["name"])
    events = json.dumps(run.events)
    trainers = "".join(cluster.logs(run.release.jobs, p["metadata"]["name"]) for p in run.trainer_pods)
    assert "final check passed" in trainers, trainers[-2000:]  # the logs were read
    status = json.dumps(get(cluster, run.release.jobs, "trained")["status"])
    for secret in [*tokens, run.secret_value, *[t.split(".")[2] for t in tokens]]:
        assert secret not in log, "a secret appears in the operator's log"
        assert secret not in events, "a secret appears in an Event"
        assert secret not in trainers, "a secret appears in a trainer's log"
        assert secret not in status, "a secret appears in the DDPJob's status"


def test_trainer_pods_run_non_root_without_a_token(cluster: Cluster, run: Run) -> None:
    assert run.trainer_pods, "the trained job left no pods to inspect"
    rendered = yaml.safe_load_all(
        cluster.kubectl(
            "get", "jobs", "-n", run.release.jobs, "-l", "ddpjob.io/job-name=trained", "-o", "yaml"
        ).stdout
    )
    templates = [job["spec"]["template"] for doc in rendered for job in doc["items"]]
    for spec in [t["spec"] for t in templates] + [p["spec"] for p in run.trainer_pods]:
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] > 0
        for container in spec["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert SERVICE_ACCOUNT_DIR not in [m["mountPath"] for m in container.get("volumeMounts") or []]
        assert not [v for v in spec.get("volumes") or [] if "projected" in v], spec.get("volumes")


def test_upgrade_with_monitoring_then_uninstall_leaves_only_the_crds(cluster: Cluster, run: Run) -> None:
    release = run.release
    crd_files = prometheus_operator_crds()
    names = [yaml.safe_load(path.read_text())["metadata"]["name"] for path in crd_files]
    # the paging test may have deleted these CRDs a moment ago: re-create them once they are gone
    cluster.kubectl("wait", "--for=delete", *[f"crd/{n}" for n in names], "--timeout=120s", check=False)
    for path in crd_files:
        cluster.kubectl("apply", "--server-side", "-f", str(path))
    try:
        cluster.wait_established(*[f"crd/{n}" for n in names])
        release.upgrade(
            **{
                "metrics.serviceMonitor.enabled": True,
                "metrics.podMonitor.enabled": True,
                "prometheusRule.enabled": True,
                "grafanaDashboard.enabled": True,
            }
        )
        ns, selector = release.namespace, release.selector
        for kind in ("servicemonitors", "podmonitors", "prometheusrules", "services", "configmaps"):
            assert cluster.kubectl_json("get", kind, "-n", ns, "-l", selector)["items"], (
                f"no {kind} after upgrade"
            )
        assert release.operator_pod()["metadata"]["uid"] == run.operator_pod["metadata"]["uid"]
        release.uninstall()
        left: list[str] = []

        def gone() -> bool:  # the garbage collector removes the ReplicaSet and the pod after helm returns
            left[:] = release.leftovers() + [
                f"pods/{ns}/{p['metadata']['name']}"
                for p in cluster.kubectl_json("get", "pods", "-n", ns)["items"]
            ]
            return not left

        try:
            wait_for(gone, what=f"every object of release {release.name} to be gone", timeout=90, every=1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; still there: {sorted(set(left))}") from None
        for crd in CRDS:
            cluster.kubectl("get", "crd", crd)
        assert get(cluster, release.jobs, "trained")["status"]["phase"] == "Succeeded"  # DDPJobs stay
    finally:
        cluster.kubectl("delete", "crd", *names, "--wait=false", check=False)
