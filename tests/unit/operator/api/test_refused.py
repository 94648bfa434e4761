"""A corpus of refused specs (``tests/unit/operator/refused/*.yaml``, several problems in most):
`ddpjob validate` names, in one run, every field the real API server names.

Each file says, in its header, where the server refuses it (``refused-on: DDPJob``, when it is applied;
``Job`` or ``PersistentVolumeClaim``, when the operator dry-runs what it renders from a DDPJob the server
took) and the fields it names (``fields:``, a YAML list; ``""`` is a problem at no field, which the server
prints as ``<nil>``). The offline half holds `validate` to the header; the cluster half holds the API
server to it and to `validate`, so the header cannot drift from the server.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_operator import cli
from ddp_operator.api import crd, podcheck, schema, spec
from ddp_operator.children import render

CORPUS = sorted((Path(__file__).parent / "refused").glob("*.yaml"))


@dataclasses.dataclass(frozen=True)
class Case:
    doc: dict[str, Any]
    refused_on: str
    fields: frozenset[str]


def case(path: Path) -> Case:
    text = path.read_text()
    header = dict(re.findall(r"^# ([-a-z]+): (.*)$", text, re.MULTILINE))
    assert header.get("refused-on") in ("DDPJob", "PersistentVolumeClaim", "Job") and "fields" in header, (
        f"{path}: header"
    )
    return Case(yaml.safe_load(text), header["refused-on"], frozenset(yaml.safe_load(header["fields"])))


def validate_fields(doc: dict[str, Any]) -> frozenset[str]:
    with pytest.raises(spec.SpecError) as refused:
        spec.parse(doc)
    return frozenset(problem.path for problem in refused.value.problems)


def test_the_corpus_has_files_with_several_problems_each() -> None:
    cases = [case(path) for path in CORPUS]
    assert len(cases) >= 4 and sum(len(c.fields) >= 3 for c in cases) >= 3
    assert {c.refused_on for c in cases} == {"DDPJob", "PersistentVolumeClaim", "Job"}


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_validate_names_every_field_in_one_run(
    path: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    expected = case(path)
    assert validate_fields(expected.doc) == expected.fields
    assert cli.main(["validate", str(path)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == len(expected.fields), "one line per problem:\n" + "\n".join(lines)


def test_the_boundaries_are_accepted() -> None:
    """The quantity checks refuse below the server's bounds, not at them: zero requests, limits and /dev/shm
    size, and the smallest claim, pass."""
    doc = case(CORPUS[0]).doc | {"metadata": {"name": "edges"}}
    doc["spec"] = {
        "nodes": 2,
        "resources": {"limits": {"cpu": "0"}, "requests": {"memory": "0"}},
        "shmSize": "0",
        "checkpoint": {"volumeClaimTemplate": {"size": "1", "accessModes": ["ReadWriteMany"]}},
    }
    assert spec.parse(doc).shm_size == "0"


# --- the real API server --------------------------------------------------------------------------------

_KEYED = re.compile(r"^(.*)\[([^\]]+)\]$")
_CONTAINER = "spec.template.spec.containers[0]."
_INDEXED = re.compile(r"^spec\.template\.spec\.(?:volumes|containers\[0\]\.volumeMounts)\[(\d+)\]\.")


def ddpjob_field(kind: str, field: str, obj: dict[str, Any]) -> str:
    """The DDPJob field a refused field of a rendered object comes from
    (``spec.template.spec.containers[0].resources.limits[cpu]`` of the Job → ``spec.resources.limits.cpu``);
    one with no counterpart here stays as the object's, marked, so that the comparison shows it."""
    if kind == "PersistentVolumeClaim" and field == "spec.resources[storage]":
        return "spec.checkpoint.volumeClaimTemplate.size"
    if kind == "Job" and field.startswith(_CONTAINER + "resources."):
        keyed = _KEYED.match("spec." + field.removeprefix(_CONTAINER))
        return schema.join(keyed[1], keyed[2]) if keyed else "spec." + field.removeprefix(_CONTAINER)
    if kind == "Job" and (indexed := _INDEXED.match(field)):
        pod = obj["spec"]["template"]["spec"]
        listed = pod["volumes"] if ".volumes[" in field else pod["containers"][0]["volumeMounts"]
        if listed[int(indexed[1])]["name"] == podcheck.SHM_VOLUME:  # the volume, or its mount
            return "spec.shmSize"
    return f"{kind} {field}"


def server_fields(refusal: Any) -> frozenset[str]:
    """The fields of a 422's causes; ``<nil>`` (no field) as ``""``."""
    status = json.loads(refusal.body)
    assert status.get("code") == 422, status
    fields = {cause.get("field", "") for cause in status["details"]["causes"]}
    return frozenset("" if field == "<nil>" else field for field in fields)


@pytest.mark.cluster
@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_the_api_server_names_the_same_fields(path: Path, cluster: Any, namespace: str) -> None:
    """The DDPJob is created with ``dryRun``; one the server takes is rendered, and its objects are created
    with ``dryRun`` in the operator's order (``reconcile._create_children``) up to the first it refuses."""
    from testcluster.kubeapi import ApiError

    cluster.kubectl("apply", "--server-side", "-f", "-", input=crd.crd_text())
    cluster.wait_established(f"crd/{crd.PLURAL}.{crd.GROUP}")
    expected = case(path)
    dry_run = {"dryRun": "All", "fieldValidation": "Strict"}
    try:
        cluster.kube.request(
            "POST",
            f"/apis/{crd.API_VERSION}/namespaces/{namespace}/{crd.PLURAL}",
            expected.doc,
            params=dry_run,
        )
    except ApiError as refused:
        refused_on, fields = "DDPJob", server_fields(refused)
    else:
        parsed = dataclasses.replace(spec.parse(expected.doc, admitted=True), namespace=namespace)
        creates = [
            (
                "PersistentVolumeClaim",
                "/api/v1",
                "persistentvolumeclaims",
                render.render_checkpoint_claim(parsed),
            ),
            ("Service", "/api/v1", "services", render.render_service(parsed)),
            ("Job", "/apis/batch/v1", "jobs", render.render_job(parsed, 1)),
        ]
        for refused_on, api, plural, obj in creates:
            if obj is None:
                continue
            try:
                cluster.kube.request("POST", f"{api}/namespaces/{namespace}/{plural}", obj, params=dry_run)
            except ApiError as refused:
                fields = frozenset(ddpjob_field(refused_on, f, obj) for f in server_fields(refused))
                break
        else:
            pytest.fail("the API server takes the DDPJob and every object it renders")
    assert refused_on == expected.refused_on
    assert fields == expected.fields, f"the API server names {sorted(fields)}"
    assert validate_fields(expected.doc) == fields
