"""The kubelet's env and command-line rules (podenv), without a cluster."""

from __future__ import annotations

from decimal import Decimal

import pytest

from ddp_operator.api.kubelet import (
    ResolveError,
    expand,
    field_value,
    parse_quantity,
    pod_command,
    resolve_env,
)

POD = {
    "metadata": {
        "name": "train-0-0",
        "namespace": "team-a",
        "uid": "1234",
        "labels": {"app": "ddp"},
        "annotations": {"batch.kubernetes.io/job-completion-index": "3"},
    },
    "spec": {"nodeName": "node-1", "serviceAccountName": "trainer"},
    "status": {},
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)", "a"),
        ("x$(A)y$(B)z", "xaybz"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("$$$(A)", "$a"),
        ("$(A", "$(A"),
        ("$A", "$A"),
        ("cost: 5$", "cost: 5$"),
        ("$()", "$()"),
        ("", ""),
        ("$(EMPTY)!", "!"),
    ],
)
def test_expand_follows_kubernetes(text: str, expected: str) -> None:
    assert expand(text, {"A": "a", "B": "b", "EMPTY": ""}) == expected


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("metadata.name", "train-0-0"),
        ("metadata.namespace", "team-a"),
        ("metadata.uid", "1234"),
        ("metadata.labels['app']", "ddp"),
        ("metadata.annotations['batch.kubernetes.io/job-completion-index']", "3"),
        ("metadata.annotations['absent']", ""),
        ("spec.nodeName", "node-1"),
        ("spec.serviceAccountName", "trainer"),
        ("status.podIP", "10.244.1.2"),
        ("status.hostIP", "127.0.0.1"),
    ],
)
def test_field_value(path: str, expected: str) -> None:
    assert field_value(POD, path, pod_ip="10.244.1.2", host_ip="127.0.0.1") == expected


def test_field_value_rejects_unknown_path() -> None:
    with pytest.raises(ResolveError, match=r"spec\.bogus"):
        field_value(POD, "spec.bogus")


INDEX_PATH = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def test_env_in_order_with_references_and_field_refs() -> None:
    container = {
        "name": "trainer",
        "env": [
            {"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": INDEX_PATH}}},
            {"name": "MASTER_ADDR", "value": "train-0-0.train"},
            {"name": "URL", "value": "tcp://$(MASTER_ADDR):29500/$(NODE_RANK)/$(LATER)"},
            {"name": "LATER", "value": "x"},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "NOT_EXPANDED", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        ],
    }  # fmt: skip
    env = resolve_env(POD, container, pod_ip="10.244.1.7")
    assert env == {
        "NODE_RANK": "3",
        "MASTER_ADDR": "train-0-0.train",
        "URL": "tcp://train-0-0.train:29500/3/$(LATER)",
        "LATER": "x",
        "POD_IP": "10.244.1.7",
        "NOT_EXPANDED": "ddp",
    }


def test_env_from_config_maps_and_secrets() -> None:
    maps = {("team-a", "cfg"): {"A": "1", "B": "2"}}
    secrets = {("team-a", "sec"): {"TOKEN": "s3cret"}}
    container = {
        "name": "c",
        "envFrom": [
            {"configMapRef": {"name": "cfg"}, "prefix": "CFG_"},
            {"secretRef": {"name": "absent", "optional": True}},
        ],
        "env": [
            {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "B"}}},
            {"name": "T", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "TOKEN"}}},
            {"name": "O", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "nope", "optional": True}}},
        ],
    }  # fmt: skip
    env = resolve_env(
        POD,
        container,
        config_maps=lambda ns, n: maps.get((ns, n)),
        secrets=lambda ns, n: secrets.get((ns, n)),
    )
    assert env == {"CFG_A": "1", "CFG_B": "2", "B": "2", "T": "s3cret"}


def test_missing_required_config_map_names_it() -> None:
    container = {
        "name": "c",
        "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k"}}}],
    }
    with pytest.raises(ResolveError, match="ConfigMap team-a/gone not found"):
        resolve_env(POD, container, config_maps=lambda ns, n: None)


def test_resource_field_refs() -> None:
    mem_in_mi = {"resource": "requests.memory", "divisor": "1Mi"}
    container = {
        "name": "c",
        "resources": {"limits": {"cpu": "1500m", "memory": "1Gi"}},
        "env": [
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": mem_in_mi}},
            {"name": "GPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.nvidia.com/gpu"}}},
        ],
    }  # fmt: skip
    env = resolve_env(POD, container, node_allocatable={"nvidia.com/gpu": "4"})
    assert env == {"CPU": "2", "MEM_MI": "1024", "GPUS": "4"}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Decimal("0.5")),
        ("2Gi", Decimal(2**31)),
        ("1e3", Decimal(1000)),
        (4, Decimal(4)),
        ("1.5k", Decimal(1500)),
    ],
)
def test_parse_quantity(text: str | int, value: Decimal) -> None:
    assert parse_quantity(text) == value


def test_pod_command_expands_command_and_args() -> None:
    container = {
        "name": "c",
        "command": ["torchrun", "--node-rank=$(NODE_RANK)"],
        "args": ["$(MISSING)", "$$(X)"],
    }
    assert pod_command(container, {"NODE_RANK": "1"}) == ["torchrun", "--node-rank=1", "$(MISSING)", "$(X)"]


def test_pod_command_needs_something_to_run() -> None:
    with pytest.raises(ResolveError, match="neither command nor args"):
        pod_command({"name": "c"}, {})
