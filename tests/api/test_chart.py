"""The Helm chart: lints, renders schema-valid objects, least-privilege RBAC, manifests/ in sync."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from .conftest import REPO

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
    bad = subprocess.run(
        [_helm(), "lint", str(CHART), "--set", "replicaCount=2"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode != 0 and "replicaCount" in bad.stdout + bad.stderr


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
    "values", [[], ["--set", "watchNamespaces={team-a,team-b}"]], ids=["cluster", "namespaced"]
)
def test_objects_pass_the_official_schemas(values: list[str]) -> None:
    objects = _template(*values)
    for obj in objects:
        if obj["apiVersion"] == "kopf.dev/v1":  # Kopf's peering kinds: not in the official schemas
            assert obj["metadata"]["name"] == "ddpjob-operator"  # the name the handlers peer under
            continue
        kubernetes_validate.validate(obj, "1.34.0", strict=True)
    assert any(obj["apiVersion"] == "kopf.dev/v1" for obj in objects)


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


def test_rbac_is_least_privilege() -> None:
    rules = [rule for o in _template() if o["kind"] == "ClusterRole" for rule in o["rules"]]
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
    granted = {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert ("", "secrets", "get") not in granted
    assert ("", "pods", "delete") not in granted and ("", "pods", "create") not in granted
    assert ("batch", "jobs", "create") in granted and ("ddpjob.io", "ddpjobs/status", "patch") in granted


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
