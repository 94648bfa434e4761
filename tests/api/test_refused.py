"""A corpus of refused specs (``tests/api/refused/*.yaml``, several problems in most): `ddpjob validate`
names, in one run, every field the real API server names.

Each file says, in its header, where the server refuses it (``refused-on: DDPJob``, when it is applied;
``refused-on: Job``, when the operator dry-runs the Job it renders from a DDPJob the server took) and the
fields it names (``fields:``, a YAML list; ``""`` is a problem at no field, which the server prints as
``<nil>``). The offline half holds `validate` to the header; the cluster half holds the API server to it
and to `validate`, so the header cannot drift from the server.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_operator import cli, crd, render, schema, spec

CORPUS = sorted((Path(__file__).parent / "refused").glob("*.yaml"))


@dataclasses.dataclass(frozen=True)
class Case:
    doc: dict[str, Any]
    refused_on: str
    fields: frozenset[str]


def case(path: Path) -> Case:
    text = path.read_text()
    header = dict(re.findall(r"^# ([-a-z]+): (.*)$", text, re.MULTILINE))
    assert header.get("refused-on") in ("DDPJob", "Job") and "fields" in header, f"{path}: header"
    return Case(yaml.safe_load(text), header["refused-on"], frozenset(yaml.safe_load(header["fields"])))


def validate_fields(doc: dict[str, Any]) -> frozenset[str]:
    with pytest.raises(spec.SpecError) as refused:
        spec.parse(doc)
    return frozenset(problem.path for problem in refused.value.problems)


def test_the_corpus_has_files_with_several_problems_each() -> None:
    cases = [case(path) for path in CORPUS]
    assert len(cases) >= 4 and sum(len(c.fields) >= 3 for c in cases) >= 3
    assert {c.refused_on for c in cases} == {"DDPJob", "Job"}


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_validate_names_every_field_in_one_run(
    path: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    expected = case(path)
    assert validate_fields(expected.doc) == expected.fields
    assert cli.main(["validate", str(path)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == len(expected.fields), "one line per problem:\n" + "\n".join(lines)


# --- the real API server --------------------------------------------------------------------------------

# A field of the rendered Job → the DDPJob field it comes from.
_FROM_JOB = {"spec.template.spec.containers[0].resources.": "spec.resources."}
_KEYED = re.compile(r"^(.*)\[([^\]]+)\]$")


def ddpjob_field(job_field: str) -> str:
    """``spec.template.spec.containers[0].resources.limits[cpu]`` → ``spec.resources.limits.cpu``; a field
    with no DDPJob counterpart stays as the Job's, marked, so that a comparison shows it."""
    for job_prefix, prefix in _FROM_JOB.items():
        if job_field.startswith(job_prefix):
            rest = prefix + job_field.removeprefix(job_prefix)
            keyed = _KEYED.match(rest)
            return schema.join(keyed[1], keyed[2]) if keyed else rest
    return f"Job {job_field}"


def server_fields(refusal: Any) -> frozenset[str]:
    """The fields of a 422's causes; ``<nil>`` (no field) as ``""``."""
    status = json.loads(refusal.body)
    assert status.get("code") == 422, status
    fields = {cause.get("field", "") for cause in status["details"]["causes"]}
    return frozenset("" if field == "<nil>" else field for field in fields)


@pytest.mark.cluster
@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_the_api_server_names_the_same_fields(path: Path, cluster: Any, namespace: str) -> None:
    from cluster.kubeapi import ApiError

    cluster.kubectl("apply", "--server-side", "-f", "-", input=crd.crd_text())
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd.PLURAL}.{crd.GROUP}", "--timeout=60s")
    expected = case(path)
    dry_run = {"dryRun": "All", "fieldValidation": "Strict"}
    ddpjobs = f"/apis/{crd.API_VERSION}/namespaces/{namespace}/{crd.PLURAL}"
    try:
        cluster.kube.request("POST", ddpjobs, expected.doc, params=dry_run)
    except ApiError as refused:
        assert expected.refused_on == "DDPJob", f"the server refuses the DDPJob itself: {refused}"
        fields = server_fields(refused)
    else:
        assert expected.refused_on == "Job", "the server takes the DDPJob"
        parsed = dataclasses.replace(spec.parse(expected.doc, admitted=True), namespace=namespace)
        job = render.render_job(parsed, 1)
        with pytest.raises(ApiError) as refused_job:
            cluster.kube.request("POST", f"/apis/batch/v1/namespaces/{namespace}/jobs", job, params=dry_run)
        fields = frozenset(ddpjob_field(field) for field in server_fields(refused_job.value))
    assert fields == expected.fields, f"the API server names {sorted(fields)}"
    assert validate_fields(expected.doc) == fields
