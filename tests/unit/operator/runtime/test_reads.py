"""The runtime's look-up of the Secrets and ConfigMaps a spec needs (runtime/reads.read_missing), against
CoreV1Api as the kubernetes client calls it: metadata only, each once, not once the pods run, and a
refusal (the chart's checkReferences off) said once and never asked again."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from ddp_operator.runtime import reads
from helpers.reconciling import ddpjob_body

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


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> _Objects:
    objects = _Objects({("ConfigMap", "settings")})
    monkeypatch.setattr(reads, "api_client", lambda: None)
    monkeypatch.setattr(reads.kubernetes.client, "CoreV1Api", objects)
    monkeypatch.setattr(reads, "_FORBIDDEN", set())
    return objects


def test_the_missing_ones_are_found_by_their_metadata_alone(api: _Objects) -> None:
    assert reads.read_missing(ddpjob_body({"phase": "Pending"}, **NEEDS)) == {("Secret", "s3-creds")}
    assert [call[:3] for call in api.calls] == [("Secret", "s3-creds", "ns"), ("ConfigMap", "settings", "ns")]
    assert {call[3] for call in api.calls} == {reads.METADATA_ONLY}  # never a Secret's data
    assert "as=PartialObjectMetadata" in reads.METADATA_ONLY


def test_nothing_is_read_once_the_pods_run_or_for_a_spec_that_names_none(api: _Objects) -> None:
    assert reads.read_missing(ddpjob_body({"phase": "Running"}, **NEEDS)) == frozenset()
    assert reads.read_missing(ddpjob_body({"phase": "Pending"})) == frozenset()
    assert api.calls == []


def test_a_refusal_is_said_once_and_that_kind_never_asked_again(
    api: _Objects, caplog: pytest.LogCaptureFixture
) -> None:
    api.status = 403
    body = ddpjob_body({"phase": "Pending"}, **NEEDS)
    with caplog.at_level(logging.WARNING):
        assert reads.read_missing(body) == frozenset()  # unknown: the kubelet will say it
        assert reads.read_missing(body) == frozenset()
    assert len(api.calls) == 2  # each kind once, in the first reconcile
    said = [r.getMessage() for r in caplog.records if "cannot look up" in r.getMessage()]
    assert len(said) == 2 and "checkReferences" in said[0]
