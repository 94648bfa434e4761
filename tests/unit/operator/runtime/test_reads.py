"""The runtime's look-up of the Secrets and ConfigMaps a spec needs (runtime/reads.read_missing), against
CoreV1Api as the kubernetes client calls it: never outside the namespaces it was told (--check-references,
the chart's checkReferences.namespaces; none by default), there metadata only, each once, not once the pods
run, and a refusal said once and never asked again."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from ddp_operator.runtime import reads
from helpers.reconciling import ddpjob_body, parse_spec

NEEDS = {"envFrom": [{"secretRef": {"name": "s3-creds"}}, {"configMapRef": {"name": "settings"}}]}


class _Objects:
    """CoreV1Api's read of single Secrets and ConfigMaps: those in ``present`` exist; ``status`` refuses."""

    def __init__(self, present: set[tuple[str, str]], status: int = 0) -> None:
        self.present, self.status = present, status
        self.calls: list[tuple[str, str, str, str]] = []

    def __call__(self, _client: Any = None) -> _Objects:
        return self

    def _read(self, kind: str, name: str, namespace: str, **options: Any) -> Any:
        self.calls.append((kind, name, namespace, options["_headers"]["Accept"]))
        if self.status:
            raise ApiException(status=self.status, reason="Forbidden")
        if (kind, name) not in self.present:
            raise ApiException(status=404, reason="Not Found")
        return type("Response", (), {"data": json.dumps({"kind": "PartialObjectMetadata"})})()

    def read_namespaced_secret(self, name: str, namespace: str, **options: Any) -> Any:
        return self._read("Secret", name, namespace, **options)

    def read_namespaced_config_map(self, name: str, namespace: str, **options: Any) -> Any:
        return self._read("ConfigMap", name, namespace, **options)


def _missing(body: dict[str, Any]) -> frozenset[tuple[str, str]]:
    """What :func:`reads.read_missing` finds for ``body``, its spec parsed as the reconcile parses it."""
    return reads.read_missing(body, parse_spec(body))


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> _Objects:
    objects = _Objects({("ConfigMap", "settings")})
    monkeypatch.setattr(reads, "api_client", lambda: None)
    monkeypatch.setattr(reads.kubernetes.client, "CoreV1Api", objects)
    monkeypatch.setattr(reads, "_FORBIDDEN", set())
    monkeypatch.setattr(reads, "LOOK_UP_NAMESPACES", frozenset({"ns"}))
    return objects


def test_by_default_nothing_is_asked_of_the_api_server(
    api: _Objects, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No --check-references (the chart's default): no Secret or ConfigMap is ever asked for, so no 403
    either, and nothing is logged per reconcile; the kubelet's reason names a missing one."""
    monkeypatch.setattr(reads, "LOOK_UP_NAMESPACES", frozenset())
    with caplog.at_level(logging.DEBUG):
        for _ in range(3):
            assert _missing(ddpjob_body({"phase": "Pending"}, **NEEDS)) == frozenset()
    assert api.calls == [] and not caplog.records


def test_only_the_namespaces_named_are_looked_up(api: _Objects, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reads, "LOOK_UP_NAMESPACES", frozenset({"team-a"}))
    assert _missing(ddpjob_body({"phase": "Pending"}, **NEEDS)) == frozenset()  # in "ns"
    assert api.calls == []


def test_the_missing_ones_are_found_by_their_metadata_alone(api: _Objects) -> None:
    assert _missing(ddpjob_body({"phase": "Pending"}, **NEEDS)) == {("Secret", "s3-creds")}
    assert [call[:3] for call in api.calls] == [("Secret", "s3-creds", "ns"), ("ConfigMap", "settings", "ns")]
    assert {call[3] for call in api.calls} == {reads.METADATA_ONLY}  # never a Secret's data
    assert "as=PartialObjectMetadata" in reads.METADATA_ONLY


def test_nothing_is_read_once_the_pods_run_or_for_a_spec_that_names_none(api: _Objects) -> None:
    assert _missing(ddpjob_body({"phase": "Running"}, **NEEDS)) == frozenset()
    assert _missing(ddpjob_body({"phase": "Pending"})) == frozenset()
    assert api.calls == []


def test_a_refusal_is_said_once_and_that_kind_never_asked_again_there(
    api: _Objects, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """--check-references names a namespace where the chart grants nothing (a Role missing): one warning
    per kind and namespace, then no more asking there; another namespace is still asked."""
    monkeypatch.setattr(reads, "LOOK_UP_NAMESPACES", frozenset({"ns", "team-b"}))
    api.status = 403
    body = ddpjob_body({"phase": "Pending"}, **NEEDS)
    with caplog.at_level(logging.WARNING):
        assert _missing(body) == frozenset()  # unknown: the kubelet will say it
        assert _missing(body) == frozenset()
    assert len(api.calls) == 2  # each kind once, in the first reconcile
    said = [r.getMessage() for r in caplog.records if "cannot look up" in r.getMessage()]
    assert len(said) == 2 and "namespace ns" in said[0] and "checkReferences.namespaces" in said[0]
    other = ddpjob_body({"phase": "Pending"}, **NEEDS)
    other["metadata"]["namespace"] = "team-b"
    _missing(other)
    assert [call[2] for call in api.calls] == ["ns", "ns", "team-b", "team-b"]
