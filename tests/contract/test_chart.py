"""The Helm chart: lints, renders schema-valid objects, least-privilege RBAC, manifests/ in sync."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from ddp_operator.api.spec import parse
from ddp_operator.children import render
from ddp_trainer import contract
from helpers import REPO

CHART = REPO / "charts" / "ddpjob-operator"


def _helm() -> str:
    helm = Path(sys.executable).with_name("helm")
    if not helm.exists():
        pytest.fail("helm is missing: `make test` installs it into .venv/bin (hack/install_helm.py)")
    return str(helm)


def _template(*args: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [_helm(), "template", "ddpjob", str(CHART), "--namespace", "ddpjob-system", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_lint_passes_and_values_are_checked() -> None:
    ok = subprocess.run([_helm(), "lint", str(CHART)], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    for value in ("replicaCount=6", "leaseDurationSeconds=1", "renewDeadlineSeconds=0"):
        bad = subprocess.run(
            [_helm(), "lint", str(CHART), "--set", value], capture_output=True, text=True, timeout=60
        )
        assert bad.returncode != 0 and value.split("=")[0] in bad.stdout + bad.stderr, value
    standby = subprocess.run(
        [_helm(), "template", "x", str(CHART), "--set", "replicaCount=2"], capture_output=True, text=True
    )
    assert standby.returncode == 0 and "kind: PodDisruptionBudget" in standby.stdout, standby.stderr
    assert "podAntiAffinity" in standby.stdout and "--lease=default/x-ddpjob-operator" in standby.stdout
    older = subprocess.run(  # an older chart's value, kept by --reuse-values: accepted and ignored
        [_helm(), "template", "x", str(CHART), "--set", "peeringLifetimeSeconds=12"],
        capture_output=True,
        text=True,
    )
    assert older.returncode == 0 and "peering" not in older.stdout.lower(), older.stderr


def test_one_replica_acts_on_the_releases_lease_with_client_gos_timing() -> None:
    """Every replica, one or more, runs under the release's Lease in its own namespace (the operator's
    defaults, which keep client-go's rules); the chart grants get, create and update on leases there only,
    and nothing of Kopf's peering (gone: docs/operator.md)."""
    from ddp_operator.runtime import lease

    for values in ([], ["--set", "replicaCount=2"], ["--set", "watchNamespaces={team-a}"]):
        objects = _template(*values)
        args = _args(objects)
        assert "--lease=ddpjob-system/ddpjob-operator" in args, args
        timing = {a.split("=")[0]: float(a.split("=")[1]) for a in args if a.startswith(("--lease-", "--re"))}
        assert timing == {
            "--lease-duration": lease.LEASE_DURATION_SECONDS,
            "--renew-deadline": lease.RENEW_DEADLINE_SECONDS,
            "--retry-period": lease.RETRY_PERIOD_SECONDS,
        }
        lease.check_timing(*timing.values())
        assert _roles(objects)[("ddpjob-system", "ddpjob-operator-lease")] == [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "verbs": ["get", "create", "update"],
            }
        ]
        (binding,) = [
            o for o in objects if o["kind"] == "RoleBinding" and o["metadata"]["name"].endswith("-lease")
        ]
        assert binding["metadata"]["namespace"] == "ddpjob-system" and binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"][0]["name"] == "ddpjob-operator"
        rules = [rule for o in objects if o["kind"] in ("ClusterRole", "Role") for rule in o["rules"]]
        assert not [r for r in rules if "kopf.dev" in r["apiGroups"]], values
        assert not [
            r
            for r in rules
            if "leases" in r["resources"]
            and r not in _roles(objects)[("ddpjob-system", "ddpjob-operator-lease")]
        ], "leases nowhere else"
        assert not [o for o in objects if o["apiVersion"].startswith("kopf.dev")], values
        (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container[
            "env"
        ]


def test_manifests_are_generated_from_the_chart() -> None:
    rendered = subprocess.run(
        [_helm(), "template", "ddpjob", str(CHART), "--namespace", "ddpjob-system"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert (REPO / "manifests" / "operator.yaml").read_text() == rendered, "stale: run `make manifests`"


@pytest.mark.parametrize(
    "values",
    [[], ["--set", "watchNamespaces={team-a,team-b}"], ["--set", "checkReferences.namespaces={team-a}"]],
    ids=["cluster", "namespaced", "references"],
)
def test_objects_pass_the_official_schemas(values: list[str]) -> None:
    objects = _template(*values)
    for obj in objects:
        kubernetes_validate.validate(obj, "1.34.0", strict=True)


def test_operator_runs_locked_down() -> None:
    (deployment,) = [o for o in _template() if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["args"][0] == "operator"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def _granted(*args: str) -> set[tuple[str, str, str]]:
    rules = [rule for o in _template(*args) if o["kind"] == "ClusterRole" for rule in o["rules"]]
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def _roles(objects: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Every Role's rules, by (namespace, name)."""
    return {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o["rules"]
        for o in objects
        if o["kind"] == "Role"
    }


def _args(objects: list[dict[str, Any]]) -> list[str]:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def test_no_secret_or_configmap_is_readable_by_default() -> None:
    """The default grants nothing on Secrets or ConfigMaps, in no ClusterRole and no Role, and the operator
    is told to look none up (the kubelet's reason names a missing one). An older chart's boolean, which
    plain `--reuse-values` keeps (its default was true), grants nothing either, and the notes say so."""
    for values in ([], ["--set", "checkReferences=false"], ["--set", "checkReferences=true"]):
        objects = _template(*values)
        rules = [rule for o in objects if o["kind"] in ("ClusterRole", "Role") for rule in o["rules"]]
        assert not [rule for rule in rules if {"secrets", "configmaps"} & set(rule["resources"])], values
        assert not [a for a in _args(objects) if a.startswith("--check-references")], values
    notes = subprocess.run(
        [_helm(), "install", "x", str(CHART), "--dry-run", "--set", "checkReferences=true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "checkReferences: true is an older chart's value" in notes.stdout, notes.stdout + notes.stderr
    assert "checkReferences.namespaces" in notes.stdout


def test_check_references_grants_get_in_the_namespaces_listed_only() -> None:
    """checkReferences.namespaces: a Role and RoleBinding in each, get on single Secrets and ConfigMaps (never
    list or watch: no way to read them all), for the metadata-only look-up of those a spec names; nothing
    cluster-wide, and the operator told the same namespaces."""
    objects = _template("--set", "checkReferences.namespaces={team-a,team-b}")
    assert (
        _granted("--set", "checkReferences.namespaces={team-a,team-b}") == _granted()
    )  # no ClusterRole rule
    rule = {"apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": ["get"]}
    references = {key: rules for key, rules in _roles(objects).items() if key[1].endswith("-references")}
    assert references == {
        ("team-a", "ddpjob-operator-references"): [rule],
        ("team-b", "ddpjob-operator-references"): [rule],
    }
    bindings = {
        (o["metadata"]["namespace"], o["roleRef"]["kind"], o["roleRef"]["name"], o["subjects"][0]["name"])
        for o in objects
        if o["kind"] == "RoleBinding" and o["metadata"]["name"].endswith("-references")
    }
    assert bindings == {
        (ns, "Role", "ddpjob-operator-references", "ddpjob-operator") for ns in ("team-a", "team-b")
    }
    assert [a for a in _args(objects) if a.startswith("--check-references")] == [
        "--check-references=team-a",
        "--check-references=team-b",
    ]


def test_node_health_grants_nodes_only_when_on_and_passes_its_lists() -> None:
    """nodeHealth (off by default): the operator taints a faulty rank's node and follows the Nodes; the
    grant and the flags come with it, and nothing of them without it."""
    off_objects, on_objects = (
        _template(),
        _template(
            "--set",
            "nodeHealth.enabled=true",
            "--set",
            "nodeHealth.unhealthyConditions={AcceleratedHardwareReady=False,GPUProblem=True}",
        ),
    )
    off, on = _granted(), _granted("--set", "nodeHealth.enabled=true")
    assert not {r for g, r, v in off if r.startswith("nodes")}
    assert on - off == {
        ("", "nodes", "get"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("", "nodes", "patch"),
        ("", "nodes/status", "patch"),
    }
    (role,) = [o for o in on_objects if o["kind"] == "Role" and o["metadata"]["name"].endswith("node-events")]
    assert role["metadata"]["namespace"] == "default" and role["rules"] == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
    ]
    assert not [
        o for o in off_objects if o["kind"] == "Role" and o["metadata"]["name"].endswith("node-events")
    ]

    assert "--node-health" not in _args(off_objects)
    on_args = _args(on_objects)
    assert "--node-health" in on_args
    assert "--unhealthy-conditions=AcceleratedHardwareReady=False,GPUProblem=True" in on_args
    assert not [a for a in on_args if a.startswith("--unhealthy-taints")]  # empty: the operator's defaults


def test_rbac_is_least_privilege() -> None:
    granted = _granted()
    assert not {resource for group, resource, verb in granted if resource in ("secrets", "configmaps")}
    assert ("", "pods", "delete") not in granted and ("", "pods", "create") not in granted
    assert ("batch", "jobs", "create") in granted and ("ddpjob.io", "ddpjobs/status", "patch") in granted
    # why a checkpoint claim keeps the pods waiting: the claim itself and the events about it, read only
    assert ("", "persistentvolumeclaims", "get") in granted and ("", "events", "list") in granted
    assert {verb for group, resource, verb in granted if resource == "persistentvolumeclaims"} == {
        "create",
        "get",
    }
    assert ("", "events", "watch") not in granted and ("", "persistentvolumes", "get") not in granted


def test_watching_namespaces_binds_only_there() -> None:
    objects = _template("--set", "watchNamespaces={team-a,team-b}")
    bindings = [
        (o["kind"], o["metadata"].get("namespace"), o["roleRef"]["name"])
        for o in objects
        if o["kind"] in ("RoleBinding", "ClusterRoleBinding")
    ]
    assert ("RoleBinding", "team-a", "ddpjob-operator-jobs") in bindings
    assert ("RoleBinding", "team-b", "ddpjob-operator-jobs") in bindings
    assert ("ClusterRoleBinding", None, "ddpjob-operator-jobs") not in bindings
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert "--namespace=team-a" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


MONITORING = [
    "--set",
    "metrics.podMonitor.enabled=true,metrics.serviceMonitor.enabled=true",
    "--set",
    "prometheusRule.enabled=true,grafanaDashboard.enabled=true",
]
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}  # the Prometheus Operator's CRDs


def test_monitoring_is_off_by_default() -> None:
    kinds = {o["kind"] for o in _template()}
    assert not kinds & (MONITORING_KINDS | {"Service", "ConfigMap"})


def test_monitoring_lints_strictly_and_passes_the_official_schemas() -> None:
    ok = subprocess.run(
        [_helm(), "lint", "--strict", str(CHART), *MONITORING], capture_output=True, text=True, timeout=60
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    objects = _template(*MONITORING)
    assert MONITORING_KINDS | {"Service", "ConfigMap"} <= {o["kind"] for o in objects}
    for obj in objects:
        if obj["apiVersion"] == "monitoring.coreos.com/v1":
            continue  # not in the official schemas
        kubernetes_validate.validate(obj, "1.34.0", strict=True)


def test_monitoring_values_are_checked() -> None:
    bad = subprocess.run(
        [_helm(), "template", str(CHART), "--set", "metrics.podMonitor.enable=true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0 and "enable" in bad.stderr


def test_monitors_select_the_operator_and_the_trainer_pods() -> None:
    objects = {o["kind"]: o for o in _template(*MONITORING)}
    service, monitor = objects["Service"], objects["ServiceMonitor"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (deployment,) = [o for o in _template() if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["targetPort"] in {
        p["name"] for p in pod["spec"]["containers"][0]["ports"]
    }
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert {"targetLabel": "job", "replacement": "ddpjob-operator"} in monitor["spec"]["endpoints"][0][
        "relabelings"
    ]
    # the PodMonitor selects what render.py puts on every trainer pod, on the port it names
    job = {"apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob", "metadata": {"name": "j", "namespace": "n"}}
    spec = parse({**job, "spec": {"nodes": 1, "device": "cpu"}})
    trainer_labels = render.labels(spec, attempt=1)
    pods = objects["PodMonitor"]["spec"]
    assert pods["selector"]["matchLabels"].items() <= trainer_labels.items()
    endpoint = pods["podMetricsEndpoints"][0]
    assert endpoint["port"] == contract.METRICS_PORT_NAME
    assert {"targetLabel": "job", "replacement": "ddpjob-trainer"} in endpoint["relabelings"]
    assert pods["namespaceSelector"] == {"any": True}
    scoped = {o["kind"]: o for o in _template(*MONITORING, "--set", "watchNamespaces={team-a}")}
    assert scoped["PodMonitor"]["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}


def test_rules_and_dashboard_are_the_committed_files() -> None:
    objects = {o["kind"]: o for o in _template(*MONITORING, "--set", "grafanaDashboard.folder=ML")}
    alerts = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    assert objects["PrometheusRule"]["spec"] == alerts
    dashboard = objects["ConfigMap"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "ML"}
    assert json.loads(dashboard["data"]["ddpjob.json"]) == json.loads(
        (CHART / "files" / "dashboard.json").read_text()
    )
    relabelled = _template("--set", "grafanaDashboard.enabled=true,grafanaDashboard.label=dash")
    (config_map,) = [o for o in relabelled if o["kind"] == "ConfigMap"]
    assert config_map["metadata"]["labels"]["dash"] == "1"
