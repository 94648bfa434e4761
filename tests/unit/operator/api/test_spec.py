"""`ddpjob validate` gives the API server's verdict offline: each bad spec is refused with the field named."""

from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from ddp_operator import cli
from ddp_operator.api import crd, crd_fields, spec
from helpers import REPO

BASE: dict[str, Any] = {
    "apiVersion": "ddpjob.io/v1alpha1",
    "kind": "DDPJob",
    "metadata": {"name": "demo"},
    "spec": {"nodes": 2, "procsPerNode": 2, "device": "cpu", "trainer": {"steps": 10}},
}


def _with(path: str, value: Any) -> dict[str, Any]:
    """BASE with one dotted path set (a value of DELETE removes it)."""
    doc = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    target = doc
    for key in parents:
        target = target.setdefault(key, {})
    if value is DELETE:
        target.pop(last, None)
    else:
        target[last] = value
    return doc


DELETE = object()

# (what is wrong, the document, the field path that must be named, words that must appear)
BAD: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "checkpoint volume and claim template",
        _with("spec.checkpoint", {"volume": {"emptyDir": {}}, "volumeClaimTemplate": {"size": "1Gi"}}),
        "spec.checkpoint",
        "give exactly one of volume",
    ),
    ("checkpoint with neither", _with("spec.checkpoint", {"keep": 2}), "spec.checkpoint", "exactly one of"),
    (
        "checkpoint claim and bucket",
        _with("spec.checkpoint", {"s3": {"bucket": "ckpt"}, "volumeClaimTemplate": {"size": "1Gi"}}),
        "spec.checkpoint",
        "or s3 (a bucket of object storage)",
    ),
    (
        "bucket name with capitals",
        _with("spec.checkpoint", {"s3": {"bucket": "My_Bucket"}}),
        "spec.checkpoint.s3.bucket",
        "must be a match for",
    ),
    (
        "endpoint with a path",
        _with("spec.checkpoint", {"s3": {"bucket": "ckpt", "endpoint": "http://minio:9000/ckpt"}}),
        "spec.checkpoint.s3.endpoint",
        "must be a match for",
    ),
    (
        "credentials secret without a name",
        _with("spec.checkpoint", {"s3": {"bucket": "ckpt", "credentialsSecret": {}}}),
        "spec.checkpoint.s3.credentialsSecret.name",
        "Required value",
    ),
    (
        "claim without a size",
        _with("spec.checkpoint", {"volumeClaimTemplate": {"storageClassName": "nfs"}}),
        "spec.checkpoint.volumeClaimTemplate.size",
        "Required value",
    ),
    (
        "claim with a bad reclaim policy",
        _with("spec.checkpoint", {"volumeClaimTemplate": {"size": "1Gi", "reclaimPolicy": "Recycle"}}),
        "spec.checkpoint.volumeClaimTemplate.reclaimPolicy",
        'Unsupported value: "Recycle"',
    ),
    (
        "keep zero checkpoints",
        _with("spec.checkpoint", {"volume": {"nfs": {}}, "keep": 0}),
        "spec.checkpoint.keep",
        "must be ≥ 1",
    ),
    ("zero nodes", _with("spec.nodes", 0), "spec.nodes", "Invalid value: 0: must be ≥ 1"),
    ("negative nodes", _with("spec.nodes", -3), "spec.nodes", "Invalid value: -3: must be ≥ 1"),
    ("zero procs", _with("spec.procsPerNode", 0), "spec.procsPerNode", "must be ≥ 1"),
    (
        "nodes as text",
        _with("spec.nodes", "two"),
        "spec.nodes",
        'Invalid value: "two": must be of type integer',
    ),
    ("float nodes", _with("spec.nodes", 1.5), "spec.nodes", "must be of type integer"),
    ("missing nodes", _with("spec.nodes", DELETE), "spec.nodes", "Required value"),
    ("zero learning rate", _with("spec.trainer.learningRate", 0), "spec.trainer.learningRate", "must be > 0"),
    (
        "text learning rate",
        _with("spec.trainer.learningRate", "fast"),
        "spec.trainer.learningRate",
        "must be of type number",
    ),
    (
        "unknown device",
        _with("spec.device", "rocm"),
        "spec.device",
        'Unsupported value: "rocm": supported values: "cuda", "cpu"',
    ),
    ("unknown backend", _with("spec.backend", "mpi"), "spec.backend", 'supported values: "nccl", "gloo"'),
    (
        "unknown policy",
        _with("spec.syncCheck", {"onDivergence": "Explode"}),
        "spec.syncCheck.onDivergence",
        '"Fail", "Repair", "Warn"',
    ),
    (
        "unknown faulty-rank policy",
        _with("spec.syncCheck", {"onFaultyRank": "Repair"}),
        "spec.syncCheck.onFaultyRank",
        'Unsupported value: "Repair": supported values: "Fail", "Warn"',
    ),
    (
        "negative probe interval",
        _with("spec.syncCheck", {"probeEverySteps": -1}),
        "spec.syncCheck.probeEverySteps",
        "Invalid value: -1: must be ≥ 0",
    ),
    ("port zero", _with("spec.masterPort", 0), "spec.masterPort", "must be ≥ 1"),
    (
        "port too high",
        _with("spec.metricsPort", 70000),
        "spec.metricsPort",
        "Invalid value: 70000: must be ≤ 65535",
    ),
    (
        "same ports",
        _with("spec.metricsPort", 29500),
        "spec.metricsPort",
        "Invalid value: 29500: must differ from masterPort",
    ),
    (
        "unknown spec field",
        _with("spec.gpus", 8),
        "spec.gpus",
        "unknown field (accepted here: activeDeadlineSeconds",
    ),
    ("unknown nested field", _with("spec.trainer.stepz", 8), "spec.trainer.stepz", "unknown field"),
    ("unknown top-level field", _with("extra", 1), "extra", "unknown field"),
    ("over-long name", _with("metadata.name", "n" * 60), "", 'metadata.name "' + "n" * 60 + '" is too long'),
    ("name over 63", _with("metadata.name", "n" * 64), "metadata.name", "must have at most 63 characters"),
    ("upper-case name", _with("metadata.name", "MyJob"), "", "must be a DNS-1035 label"),
    ("missing name", _with("metadata", {}), "metadata.name", "Required value"),
    ("wrong kind", _with("kind", "PyTorchJob"), "kind", 'Unsupported value: "PyTorchJob"'),
    (
        "wrong apiVersion",
        _with("apiVersion", "ddpjob.io/v1"),
        "apiVersion",
        'supported values: "ddpjob.io/v1alpha1"',
    ),
    ("nccl on cpu", _with("spec.backend", "nccl"), "spec.backend", 'backend "nccl" needs device "cuda"'),
    (
        "nccl settings on cpu",
        _with("spec.nccl", {"debug": "INFO"}),
        "spec.nccl",
        'apply only to device "cuda"',
    ),
    (
        "gpus on cpu",
        _with("spec.resources", {"limits": {"nvidia.com/gpu": 1}}),
        "spec.resources.limits",
        'device "cpu" must not request nvidia.com/gpu',
    ),
    ("bad quantity", _with("spec.shmSize", "lots"), "spec.shmSize", "a Kubernetes quantity"),
    ("bad model", _with("spec.trainer.model", "my model"), "spec.trainer.model", "package.module:function"),
    (
        "duplicate env",
        _with("spec.env", [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]),
        "spec.env[1]",
        'Duplicate value: {"name": "A"}',
    ),
    (
        "reserved label",
        _with("spec.podTemplate", {"labels": {"ddpjob.io/attempt": "9"}}),
        "spec.podTemplate.labels",
        "reserved",
    ),
    (
        "reserved volume",
        _with("spec.podTemplate", {"volumes": [{"name": "dshm", "emptyDir": {}}]}),
        "spec.podTemplate.volumes[0].name",
        'volume name "dshm" is reserved',
    ),
    (
        "the sync hook's volume name",
        _with("spec.podTemplate", {"volumes": [{"name": "ddpjob-sync", "emptyDir": {}}]}),
        "spec.podTemplate.volumes[0].name",
        'volume name "ddpjob-sync" is reserved',
    ),
    (
        "the sync hook's init container name",
        _with("spec.podTemplate", {"initContainers": [{"name": "ddpjob-sync", "image": "busybox"}]}),
        "spec.podTemplate.initContainers[0].name",
        'init container name "ddpjob-sync" is reserved',
    ),
    (
        "auto-instrumentation not a boolean",
        _with("spec.syncCheck", {"autoInstrument": "yes"}),
        "spec.syncCheck.autoInstrument",
        "must be of type boolean",
    ),
    (
        "two checkpoint sources",
        _with("spec.checkpoint", {"volume": {"emptyDir": {}, "hostPath": {"path": "/x"}}}),
        "spec.checkpoint.volume",
        "must have at most 1 entries",
    ),
    (
        "relative mount path",
        _with("spec.checkpoint", {"volume": {"emptyDir": {}}, "mountPath": "ckpt"}),
        "spec.checkpoint.mountPath",
        "an absolute path",
    ),
]

GPU_BAD: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "gpu limit differs from procs",
        {"nodes": 2, "procsPerNode": 4, "resources": {"limits": {"nvidia.com/gpu": 2}}},
        'spec.resources.limits["nvidia.com/gpu"]',
        "Invalid value: 2: must equal procsPerNode",
    ),
    (
        "gpu request differs from procs",
        {"nodes": 2, "procsPerNode": 2, "resources": {"requests": {"nvidia.com/gpu": "8"}}},
        'spec.resources.requests["nvidia.com/gpu"]',
        'Invalid value: "8": must equal procsPerNode',
    ),
    (
        "bad nccl env",
        {"nodes": 2, "nccl": {"env": {"CUDA_VISIBLE_DEVICES": "0"}}},
        "spec.nccl.env",
        "must start with NCCL_ or TORCH_NCCL_",
    ),
    (
        "bad nccl debug",
        {"nodes": 2, "nccl": {"debug": "LOUD"}},
        "spec.nccl.debug",
        '"VERSION", "WARN", "INFO", "TRACE"',
    ),
    (
        "too short timeout",
        {"nodes": 2, "nccl": {"timeoutSeconds": 1}},
        "spec.nccl.timeoutSeconds",
        "must be ≥ 10",
    ),
    (
        "negative start timeout",
        {"nodes": 2, "startTimeoutSeconds": -1},
        "spec.startTimeoutSeconds",
        "must be ≥ 0",
    ),
]


def _run(paths: list[Path], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["validate", *map(str, paths)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("doc", "field", "words"),
    [
        case[1:]
        for case in BAD
        + [(name, {**BASE, "spec": spec}, field, words) for name, spec, field, words in GPU_BAD]
    ],
    ids=[case[0] for case in BAD + GPU_BAD],
)
def test_refuses_bad_spec_naming_the_field(
    doc: dict[str, Any],
    field: str,
    words: str,
    write_yaml: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = write_yaml(doc)
    code, out, err = _run([path], capsys)
    assert code == 1
    assert out == ""
    lines = err.splitlines()
    prefix = (
        f"{path}: "
        if field in ("apiVersion", "kind", "metadata.name") and "name" not in doc.get("metadata", {})
        else f"{path}: DDPJob/{doc['metadata'].get('name', '')}: "
    )
    expected = f"{prefix}{field}: " if field else prefix
    matching = [line for line in lines if line.startswith(expected) and words in line]
    assert matching, f"no line starts with {expected!r} and contains {words!r}:\n{err}"


@pytest.mark.parametrize("example", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_accepts_the_examples(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run([example], capsys)
    assert (code, err) == (0, "")
    assert ": valid (" in out


def test_reports_every_problem_at_once(
    write_yaml: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _with("spec.nodes", 0)
    doc["spec"]["device"] = "tpu"
    doc["spec"]["oops"] = True
    code, _, err = _run([write_yaml(doc)], capsys)
    assert code == 1
    assert [line.split(": ")[2] for line in err.splitlines()] == ["spec.device", "spec.nodes", "spec.oops"]


def test_good_and_bad_files_together(
    write_yaml: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    good = write_yaml(BASE, name="good.yaml")
    bad = write_yaml(_with("spec.nodes", 0), name="bad.yaml")
    code, out, err = _run([good, bad], capsys)
    assert code == 1
    assert "good.yaml: DDPJob/demo: valid (2 nodes × 2 procs = 4 ranks, cpu/gloo)" in out
    assert "bad.yaml: DDPJob/demo: spec.nodes" in err


def test_every_document_of_a_file_is_checked(
    write_yaml: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    second = _with("metadata.name", "second")
    second["spec"]["nodes"] = -1
    code, _, err = _run([write_yaml(BASE, second)], capsys)
    assert code == 1
    assert "DDPJob/second: spec.nodes: Invalid value: -1" in err
    assert "DDPJob/demo" not in err


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("spec: [unclosed", "not valid YAML: line 1"),
        ("- just\n- a list\n", "a DDPJob must be a mapping"),
        ("", "no DDPJob in this file"),
    ],
)
def test_unreadable_files(text: str, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    code, _, err = _run([path], capsys)
    assert code == 1
    assert words in err and str(path) in err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run([tmp_path / "nope.yaml"], capsys)
    assert code == 1
    assert "cannot read the file" in err


def test_validation_is_thread_safe() -> None:
    """The operator reconciles in threads; cel-python's shared environment once mixed their activations."""
    from concurrent.futures import ThreadPoolExecutor

    from ddp_operator.api.spec import SpecError, parse

    good, bad = BASE, _with("spec.backend", "nccl")

    def verdict(doc: dict[str, Any]) -> str:
        try:
            parse(doc)
        except SpecError as exc:
            return "; ".join(str(p) for p in exc.problems)
        return "ok"

    expected = {"good": verdict(good), "bad": verdict(bad)}
    assert expected["good"] == "ok" and "needs device" in expected["bad"]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(
            pool.map(lambda i: ("good", verdict(good)) if i % 2 else ("bad", verdict(bad)), range(200))
        )
    assert all(result == expected[kind] for kind, result in results)


def test_admitted_objects_keep_the_api_servers_verdict() -> None:
    from ddp_operator.api.spec import SpecError, parse

    doc = _with("spec.backend", "nccl")  # refused offline; the server's CEL decides for stored objects
    with pytest.raises(SpecError):
        parse(doc)
    assert parse(doc, admitted=True).backend == "nccl"
    with pytest.raises(SpecError, match="cannot be read"):
        parse(_with("spec.trainer", "not-a-mapping"), admitted=True)


@pytest.mark.parametrize(
    ("checkpoint", "spec", "warned"),
    [
        (None, {}, "will start from step 0"),
        ({"volume": {"emptyDir": {}}}, {}, "will start from step 0"),
        (None, {"maxRestarts": 0}, None),
        ({"volumeClaimTemplate": {"size": "1Gi"}}, {}, None),
        ({"volume": {"nfs": {"server": "n", "path": "/x"}}}, {}, None),
        # ReadWriteOnce (the default) from the default class: pods of one node share it (the quickstart)
        ({"volumeClaimTemplate": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}}, {}, None),
        # ReadWriteMany from the default class: kind, minikube and the clouds' block storage refuse it
        (
            {"volumeClaimTemplate": {"size": "1Gi", "accessModes": ["ReadWriteMany"]}},
            {},
            "gives only ReadWriteOnce (the claim would stay Pending); name a storageClassName whose class "
            "gives ReadWriteMany",
        ),
        (
            {"volumeClaimTemplate": {"size": "1Gi", "accessModes": ["ReadWriteMany"]}},
            {"nodes": 1},
            "name accessModes [ReadWriteOnce], or use spec.checkpoint.s3",
        ),
        (
            {
                "volumeClaimTemplate": {
                    "size": "1Gi",
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "nfs",
                }
            },
            {},
            None,
        ),
        (
            {"volumeClaimTemplate": {"size": "1Gi", "accessModes": ["ReadWriteOncePod"]}},
            {},
            "lets one pod only mount the claim, but every one of the 2 pods",
        ),
        (
            {"volumeClaimTemplate": {"size": "1Gi"}},
            {"device": "cuda"},
            "likely on several nodes (the others would fail with a Multi-Attach error)",
        ),
    ],
)
def test_warns_where_restarts_would_lose_the_checkpoints(
    checkpoint: dict[str, Any] | None,
    spec: dict[str, Any],
    warned: str | None,
    write_yaml: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = copy.deepcopy(BASE)
    doc["spec"].update(spec)
    if checkpoint is not None:
        doc["spec"]["checkpoint"] = checkpoint
    path = write_yaml(doc)
    code, out, err = _run([path], capsys)
    assert code == 0 and ": valid (" in out
    if warned is None:
        assert err == ""
    else:
        field = "spec.checkpoint" if "step 0" in warned else "spec.checkpoint.volumeClaimTemplate.accessModes"
        assert err.startswith(f"{path}: DDPJob/demo: warning: {field}: ") and warned in err, err


def _unmatched(cls: Any, node: Mapping[str, Any], path: str) -> list[str]:
    """Every CRD property under ``node`` that no field of ``cls`` reads, and every field whose property
    is not in the CRD, recursively through nested dataclasses."""
    hints = typing.get_type_hints(cls)
    props, covered, out = set(node.get("properties", {})), set(), []
    for f in dataclasses.fields(cls):
        key = crd_fields.crd_key(f)
        if key is None:
            continue
        head = key.split(".")[0]
        covered.add(head)
        if head not in props:
            out.append(f"{path}: field {cls.__name__}.{f.name} reads {key!r}, which the CRD does not have")
            continue
        nested, _ = crd_fields._nested(hints[f.name])
        if nested is not None:
            out += _unmatched(nested, node["properties"][head], f"{path}.{head}")
    out += [f"{path}.{p}: in the CRD, read by no field of {cls.__name__}" for p in sorted(props - covered)]
    return out


def test_the_spec_type_and_the_crd_schema_are_one_source() -> None:
    """Spec's dataclasses are read from the CRD by name (``crd_fields.from_crd``): a property added to the CRD
    without its field, or a field without its property, fails here, naming it."""
    assert _unmatched(spec.Spec, crd.openapi_schema()["properties"]["spec"], "spec") == []


def test_the_round_trip_check_can_fail() -> None:
    @dataclasses.dataclass(frozen=True)
    class Small:
        steps: int
        batch_size: int = 1

    node = {"properties": {"steps": {"type": "integer"}, "warmupSteps": {"type": "integer"}}}
    assert _unmatched(Small, node, "spec.trainer") == [
        "spec.trainer: field Small.batch_size reads 'batchSize', which the CRD does not have",
        "spec.trainer.warmupSteps: in the CRD, read by no field of Small",
    ]
    assert crd_fields.from_crd(Small, {"steps": 7}, node) == {"steps": 7}
