"""Specs refused before they fail: what the API server would refuse only when the Job is created,
`ddpjob validate` refuses up front, naming the key and the value (issue 15). The same specs are proven
refused by the real API server in tests/e2e/test_newcomer.py."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddp_operator import cli
from ddp_operator.api import spec, spec_warnings
from ddp_operator.children import objects
from helpers.spec_docs import VOLUME, doc_with

# (what is wrong, spec fields, the field path named, words that must appear: the key and the value)
REFUSED: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "gpu request on a cpu job",
        {"resources": {"requests": {"nvidia.com/gpu": 1}}},
        "spec.resources.requests",
        'device "cpu" must not request nvidia.com/gpu',
    ),
    (
        "request above limit",
        {"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}},
        "spec.resources.requests",
        'Invalid value: "2Gi": spec.resources.requests.memory must be less than or equal to the limit '
        'spec.resources.limits.memory "1Gi"',
    ),
    (
        "invalid label key",
        {"podTemplate": {"labels": {"team name": "a"}}},
        "spec.podTemplate.labels.team name",
        'Invalid value: "team name": a label key is',
    ),
    (
        "invalid label value",
        {"podTemplate": {"labels": {"team": "a b"}}},
        "spec.podTemplate.labels.team",
        'Invalid value: "a b": a label value is',
    ),
    (
        "mount of a volume that does not exist",
        {"podTemplate": {"volumes": [VOLUME], "volumeMounts": [{"name": "dta", "mountPath": "/d"}]}},
        "spec.podTemplate.volumeMounts[0].name",
        'Not found: "dta": no volume of that name',
    ),
    (
        "env with value and valueFrom",
        {"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
        "spec.env[0]",
        'variable "A" has both value and valueFrom',
    ),
    ("bad namespace", {"namespace": "Team_A"}, "metadata.namespace", 'Invalid value: "Team_A"'),
    (
        "reserved label names its key",
        {"podTemplate": {"labels": {"ddpjob.io/attempt": "9"}}},
        "spec.podTemplate.labels",
        'label key "ddpjob.io/attempt" is reserved',
    ),
    (
        "nccl env names its key",
        {"device": "cuda", "nccl": {"env": {"NCCL_DEBUG_FILE": "x", "CUDA_VISIBLE_DEVICES": "0"}}},
        "spec.nccl.env",
        'variable "CUDA_VISIBLE_DEVICES": names must start with NCCL_ or TORCH_NCCL_',
    ),
]


@pytest.mark.parametrize(("fields", "field", "words"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_validate_refuses_naming_key_and_value(
    fields: dict[str, Any],
    field: str,
    words: str,
    write_yaml: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = write_yaml(doc_with(**copy.deepcopy(fields)))
    assert cli.main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: DDPJob/demo: {field}: " in err and words in err, err


def test_the_good_twins_are_accepted() -> None:
    """The rules refuse the mistake, not the feature: a valid key, value, mount and namespace pass."""
    good = doc_with(
        namespace="team-a",
        resources={"requests": {"memory": "1Gi"}, "limits": {"memory": "1Gi"}},
        podTemplate={
            "labels": {"example.com/team": "a.b-c_d", "empty": ""},
            "volumes": [VOLUME],
            "volumeMounts": [{"name": "data", "mountPath": "/d"}, {"name": "checkpoint", "mountPath": "/c"}],
        },
        env=[{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
    )
    parsed = spec.parse(good)
    assert parsed.namespace == "team-a" and objects.render(parsed)


def test_a_custom_command_with_trainer_settings_warns() -> None:
    parsed = spec.parse(doc_with(command=["python", "train.py"], trainer={"steps": 10}, syncCheck={}))
    (warning,) = [w for w in spec_warnings.warnings(parsed) if "ignored" in w]
    assert warning.startswith("spec.trainer: ignored, because spec.command/spec.args")
    # spec.syncCheck reaches any program (DDPJOB_SYNC_EVERY, DDPJOB_ON_DIVERGENCE): no warning for it alone
    alone = spec.parse(doc_with(command=["python", "train.py"], syncCheck={"everySteps": 5}))
    assert not [w for w in spec_warnings.warnings(alone) if "ignored" in w]
    assert not [
        w for w in spec_warnings.warnings(spec.parse(doc_with(trainer={"steps": 10}))) if "ignored" in w
    ]


def test_an_elastic_job_whose_command_is_torchrun_warns_that_it_will_not_resize() -> None:
    """A command of [torchrun] (as public scripts are run) keeps torchrun's static rendezvous: said at
    validate and at `ddpjob local`'s start, naming the field and the fix."""
    elastic = {"minNodes": 1, "maxNodes": 3}
    script = {"args": ["train.py", "10"]}
    parsed = spec.parse(doc_with(nodes=3, elastic=elastic, command=["torchrun"], **script))
    (warning,) = [w for w in spec_warnings.warnings(parsed) if w.startswith("spec.elastic")]
    assert warning == spec_warnings.not_elastic(parsed)
    assert "spec.command ['torchrun']" in warning and "leave spec.command out" in warning, warning
    launched = doc_with(nodes=3, elastic=elastic, **script)
    rigid = doc_with(nodes=3, command=["torchrun"], **script)
    for fine in (launched, rigid):
        assert spec_warnings.not_elastic(spec.parse(fine)) is None
