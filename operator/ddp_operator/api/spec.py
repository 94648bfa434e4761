"""A DDPJob document → a frozen, defaulted, validated ``Spec``.

The verdict is the API server's: the CRD's own schema and CEL rules (``schema.validate``), plus the checks
the server does before it ever reaches the schema (apiVersion, kind, a name) and of every object's name;
once the server would take the DDPJob, what it would refuse of the Job (``podcheck``). Every problem names
the field, the value and what would be accepted; ``SpecError`` carries all of them at once. ``warnings`` says
what is valid but probably unintended (restarts that would start from step 0, say).

Long because the dataclasses mirror the CRD's spec one to one; the logic is ``parse`` and ``_build``.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from collections.abc import Mapping as AbcMapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Union

import yaml

from ddp_operator.api import crd, podcheck, schema
from ddp_operator.api.schema import Problem
from ddp_trainer import contract

OBJECT_STORAGE = "spec.checkpoint.s3 (object storage)"
"""The way around a cluster's volumes, offered by every fix that needs another kind of storage."""


class SpecError(ValueError):
    """A DDPJob the API server would refuse; ``problems`` says why, one line each."""

    def __init__(self, problems: Sequence[Problem], source: str = "") -> None:
        self.problems = list(problems)
        self.source = source
        super().__init__("\n".join(self.lines()))

    def lines(self) -> list[str]:
        prefix = f"{self.source}: " if self.source else ""
        return [f"{prefix}{problem}" for problem in self.problems]


_NOT_IN_SPEC: Mapping[str, Any] = {"key": None}
"""A field that is not read from ``spec`` (the name, the namespace, a value derived in ``_build``)."""


@dataclass(frozen=True)
class TrainerSpec:
    seed: int
    steps: int
    batch_size: int
    learning_rate: float
    grad_accumulation: int
    checkpoint_every: int
    model: str


@dataclass(frozen=True)
class SyncCheckSpec:
    every_steps: int
    on_divergence: str
    probe_every_steps: int = 1000
    on_faulty_rank: str = "Fail"
    auto_instrument: bool = True


@dataclass(frozen=True)
class ElasticSpec:
    """``spec.elastic``: the range of nodes the job trains on (``spec.nodes`` is the desired size)."""

    min_nodes: int
    max_nodes: int
    below_min_timeout_seconds: int = 600


@dataclass(frozen=True)
class NcclSpec:
    timeout_seconds: int
    trace_buffer_size: int
    debug: str | None = None
    socket_ifname: str | None = None
    ib_disable: bool | None = None
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ClaimTemplateSpec:
    size: int | str
    access_modes: tuple[str, ...]
    reclaim_policy: str
    storage_class_name: str | None = None


@dataclass(frozen=True)
class S3Spec:
    bucket: str
    prefix: str = ""
    endpoint: str | None = None
    region: str | None = None
    secret_name: str | None = field(default=None, metadata={"key": "credentialsSecret.name"})
    access_key_id_key: str = field(
        default="AWS_ACCESS_KEY_ID", metadata={"key": "credentialsSecret.accessKeyIdKey"}
    )
    secret_access_key_key: str = field(
        default="AWS_SECRET_ACCESS_KEY", metadata={"key": "credentialsSecret.secretAccessKeyKey"}
    )

    @property
    def url(self) -> str:
        """``s3://bucket/prefix``: the trainer's ``--checkpoint-dir``."""
        return f"s3://{self.bucket}/{self.prefix.strip('/')}"


@dataclass(frozen=True)
class CheckpointSpec:
    mount_path: str
    keep: int
    volume: Mapping[str, Any] | None = None
    claim: ClaimTemplateSpec | None = field(default=None, metadata={"key": "volumeClaimTemplate"})
    warm_start_from: str | None = None
    s3: S3Spec | None = None


@dataclass(frozen=True)
class PodTemplateSpec:
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] | None = None
    priority_class_name: str | None = None
    scheduler_name: str | None = None
    service_account_name: str | None = None
    volumes: tuple[Mapping[str, Any], ...] = ()
    volume_mounts: tuple[Mapping[str, Any], ...] = ()
    image_pull_secrets: tuple[Mapping[str, Any], ...] = ()
    runtime_class_name: str | None = None
    security_context: Mapping[str, Any] = field(default_factory=dict)
    container_security_context: Mapping[str, Any] = field(default_factory=dict)
    host_network: bool | None = None
    dns_policy: str | None = None
    init_containers: tuple[Mapping[str, Any], ...] = ()
    topology_spread_constraints: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class Spec:
    """One DDPJob, defaulted and valid. Field meanings: ``kubectl explain ddpjob.spec``."""

    name: str = field(metadata=_NOT_IN_SPEC)
    namespace: str = field(metadata=_NOT_IN_SPEC)
    nodes: int
    procs_per_node: int
    device: str
    backend: str
    """``spec.backend``, else the device's (nccl on cuda, gloo on cpu): ``_build`` fills it in."""
    image: str
    command: tuple[str, ...] | None
    args: tuple[str, ...] | None
    working_dir: str | None
    env: tuple[Mapping[str, Any], ...]
    env_from: tuple[Mapping[str, Any], ...]
    resources: Mapping[str, Mapping[str, int | str]]
    trainer: TrainerSpec
    sync_check: SyncCheckSpec
    nccl: NcclSpec
    master_port: int
    metrics_port: int
    shm_size: int | str
    checkpoint: CheckpointSpec | None
    max_restarts: int
    ttl_seconds_after_finished: int | None
    active_deadline_seconds: int | None
    suspend: bool
    queue_name: str | None
    workload_priority_class: str | None = field(metadata={"key": "workloadPriorityClassName"})
    pod_template: PodTemplateSpec
    uid: str | None = field(default=None, metadata=_NOT_IN_SPEC)
    given: frozenset[str] = field(default=frozenset(), metadata=_NOT_IN_SPEC)
    """The spec fields the document itself sets (before defaults)."""
    node_lost_toleration_seconds: int = 30
    elastic: ElasticSpec | None = None
    stall_timeout_seconds: int = 600
    start_timeout_seconds: int = 900

    @property
    def world_size(self) -> int:
        """Processes in the gang (not pods)."""
        return self.nodes * self.procs_per_node


DEFAULT_NAMESPACE = "default"


def load_documents(path: Path) -> list[Any]:
    """The YAML documents of a file (empty ones skipped); a syntax error is a SpecError naming the line."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError([Problem("", f"cannot read the file: {exc.strerror}")], str(path)) from exc
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise SpecError(
            [Problem("", f"not valid YAML: {where}{getattr(exc, 'problem', exc)}")], str(path)
        ) from exc


def _envelope_problems(doc: Any) -> list[Problem]:
    """What the API server checks before the schema: the document is a named DDPJob."""
    if not isinstance(doc, dict):
        return [
            Problem(
                "",
                f"Invalid value: {schema.show(doc)}: a DDPJob must be a mapping (apiVersion, "
                "kind, metadata, spec)",
            )
        ]
    problems = []
    if doc.get("apiVersion") != crd.API_VERSION:
        problems.append(
            Problem(
                "apiVersion",
                f"Unsupported value: {schema.show(doc.get('apiVersion'))}: "
                f'supported values: "{crd.API_VERSION}"',
            )
        )
    if doc.get("kind") != crd.KIND:
        problems.append(
            Problem(
                "kind", f'Unsupported value: {schema.show(doc.get("kind"))}: supported values: "{crd.KIND}"'
            )
        )
    metadata = doc.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str) or not metadata["name"]:
        problems.append(Problem("metadata.name", "Required value: a DDPJob needs a name"))
    elif "namespace" in metadata and not isinstance(metadata["namespace"], str):
        problems.append(
            Problem(
                "metadata.namespace", f"Invalid value: {schema.show(metadata['namespace'])}: must be a string"
            )
        )
    return problems


def _name_problems(name: str) -> list[Problem]:
    """The API server's rule for every custom object's name, checked next to the CRD's own schema and rules
    (which say more of it), all reported at once."""
    if podcheck.is_dns_subdomain(name):
        return []
    return [
        Problem(
            "metadata.name",
            f"Invalid value: {schema.show(name)}: a lowercase RFC 1123 subdomain must consist of lowercase "
            "letters, digits, '-' or '.', start and end with a letter or digit, and have at most 253 "
            "characters (e.g. example.com)",
        )
    ]


def defaulted(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The document with the CRD's defaults applied, as the API server stores it."""
    result: dict[str, Any] = schema.apply_defaults(crd.openapi_schema(), doc)
    return result


def parse(doc: Any, source: str = "", *, admitted: bool = False) -> Spec:
    """Validate and default one DDPJob document; raise SpecError with every problem found.

    ``admitted=True`` is for objects the API server already stored, having checked them against this
    CRD: its verdict stands, so only the defaults are applied (a second, offline CEL evaluation could only
    disagree with the server's, never improve on it); a shape ``_build`` cannot read is still an error.
    """
    problems = _envelope_problems(doc)
    if problems:
        raise SpecError(problems, _label(doc, source))
    full = defaulted(doc)
    problems = (
        []
        if admitted
        else [*_name_problems(doc["metadata"]["name"]), *schema.validate(crd.openapi_schema(), full)]
    )
    if not admitted and not problems:
        problems = podcheck.problems(full)  # what the server says of the Job, once it takes the DDPJob
    if problems:
        raise SpecError(problems, _label(doc, source))
    try:
        given = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
        return replace(_build(full), given=frozenset(given))
    except (KeyError, TypeError, ValueError) as exc:
        raise SpecError(
            [
                Problem(
                    "spec",
                    f"cannot be read ({type(exc).__name__}: {exc}); is the installed "
                    "CRD older than this operator?",
                )
            ],
            _label(doc, source),
        ) from exc


def other_kinds(docs: Sequence[Any]) -> tuple[list[Any], list[str]]:
    """The documents that may be DDPJobs, and ``Kind/name`` of each that is plainly another kind (a
    Namespace or ConfigMap next to the DDPJob in one file, as ``kubectl apply -f`` takes them)."""
    kept, skipped = [], []
    for doc in docs:
        kind = doc.get("kind") if isinstance(doc, dict) else None
        if isinstance(kind, str) and kind != crd.KIND and doc.get("apiVersion") != crd.API_VERSION:
            name = doc.get("metadata", {}).get("name") if isinstance(doc.get("metadata"), dict) else None
            skipped.append(f"{kind}/{name or '?'}")
        else:
            kept.append(doc)
    return kept, skipped


def parse_file(path: Path, docs: Sequence[Any] | None = None) -> list[Spec]:
    """Every DDPJob in a file (or in ``docs`` read from it); SpecError lists the problems of all of them."""
    specs, problems = [], []
    for doc in load_documents(path) if docs is None else docs:
        try:
            specs.append(parse(doc, str(path)))
        except SpecError as exc:
            problems.extend(exc.lines())
    if problems:
        raise SpecError([Problem("", line) for line in problems])
    if not specs:
        raise SpecError([Problem("", "no DDPJob in this file")], str(path))
    return specs


def _label(doc: Any, source: str) -> str:
    name = doc.get("metadata", {}).get("name") if isinstance(doc, dict) else None
    named = f"{crd.KIND}/{name}" if isinstance(name, str) and name else ""
    return ": ".join(part for part in (source, named) if part)


def _build(doc: Mapping[str, Any]) -> Spec:
    s, metadata = doc["spec"], doc["metadata"]
    read = from_crd(Spec, s, crd.openapi_schema()["properties"]["spec"])
    read["backend"] = read["backend"] or ("nccl" if read["device"] == "cuda" else "gloo")
    return Spec(
        **read,
        name=metadata["name"],
        namespace=metadata.get("namespace") or DEFAULT_NAMESPACE,
        uid=metadata.get("uid"),
    )


def crd_key(f: Any) -> str | None:
    """The CRD property (a dotted path under its object) a dataclass field is read from: its camelCase
    name, unless the field says otherwise (``metadata={"key": ...}``; None: not read from the spec)."""
    if "key" in f.metadata:
        key: str | None = f.metadata["key"]
        return key
    head, *rest = str(f.name).split("_")
    return head + "".join(word.capitalize() for word in rest)


def _lookup(mapping: Mapping[str, Any], path: str) -> Any:
    for part in path.split("."):
        if not isinstance(mapping, AbcMapping) or part not in mapping:
            return MISSING
        mapping = mapping[part]
    return mapping


def _nested(kind: Any) -> tuple[Any, bool]:
    """The dataclass a field holds (or None), and whether the field may be None."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return (inner[0] if len(inner) == 1 and is_dataclass(inner[0]) else None), True
    return (kind if is_dataclass(kind) else None), False


def _convert(kind: Any, value: Any) -> Any:
    origin = typing.get_origin(kind)
    if origin in (Union, types.UnionType):
        kinds = [a for a in typing.get_args(kind) if a is not type(None)]
        return value if value is None or len(kinds) != 1 else _convert(kinds[0], value)
    if origin is tuple:
        return tuple(value)
    if origin in (Mapping, AbcMapping, dict):
        return {k: dict(v) if isinstance(v, AbcMapping) else v for k, v in value.items()}
    if kind is float:
        return float(value)
    return value


def from_crd(cls: Any, mapping: Mapping[str, Any], node: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of dataclass ``cls`` read from ``mapping``, a CRD object whose schema is ``node``: each
    field from its :func:`crd_key`, converted by its type (tuples, mappings, floats), a nested dataclass
    read the same way (an absent object takes its schema's defaults, or None where the field may be None).
    Absent fields keep the dataclass's default (else empty, or None: :func:`_empty`). The CRD's schema is
    the one source; tests/unit/operator/api/test_spec.py proves every property has a field and every field a
    property. A value of the wrong shape where an object belongs is a ``TypeError`` naming it."""
    if not isinstance(mapping, AbcMapping):
        raise TypeError(f"expected an object for {cls.__name__}, got {type(mapping).__name__}")
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in fields(cls):
        key = crd_key(f)
        if key is None:
            continue
        kind = hints[f.name]
        sub, optional = _nested(kind)
        value = _lookup(mapping, key)
        if sub is not None:
            sub_node = _node(node, key)
            if value is MISSING and optional:
                out[f.name] = None
                continue
            if value is MISSING:
                value = schema.apply_defaults(sub_node, {})
            out[f.name] = sub(**from_crd(sub, value, sub_node))
        elif value is not MISSING:
            out[f.name] = _convert(kind, value)
        elif f.default is MISSING and f.default_factory is MISSING:
            out[f.name] = _empty(kind)
    return out


def _empty(kind: Any) -> Any:
    """An absent list is an empty tuple, an absent object an empty mapping, anything else None."""
    origin = typing.get_origin(kind)
    return () if origin is tuple else {} if origin in (Mapping, AbcMapping, dict) else None


def _node(node: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    for part in path.split("."):
        node = node["properties"][part]
    return node


def checkpoints_durable(spec: Spec) -> bool:
    """Whether a gang restart finds the checkpoints of the attempt before (a volume that outlives pods)."""
    c = spec.checkpoint
    return c is not None and (c.claim is not None or c.s3 is not None or "emptyDir" not in (c.volume or {}))


def known_total_steps(spec: Spec) -> int:
    """The run's total optimizer steps as the spec knows it: ``spec.trainer.steps`` for the built-in
    trainer, 0 (not known) for a command of the user's, which does not read it (its code may say so:
    ``ddp_total_steps``)."""
    return spec.trainer.steps if spec.command is None and spec.args is None else 0


def _python_path(spec: Spec) -> Mapping[str, Any] | None:
    return next((e for e in spec.env if e.get("name") == "PYTHONPATH"), None)


def sync_hook(spec: Spec) -> bool:
    """Whether the pods get the no-code-change sync hook: ``spec.syncCheck.autoInstrument`` on, a command of
    the user's (the built-in trainer checks itself), and a ``PYTHONPATH`` the hook's folder can go in front
    of (not one from ``valueFrom``)."""
    if not spec.sync_check.auto_instrument or (spec.command is None and spec.args is None):
        return False
    user = _python_path(spec)
    return user is None or "valueFrom" not in user


def runs_launcher(spec: Spec) -> bool:
    """Whether the container runs ``ddp_trainer.launch`` (the image's ENTRYPOINT: no ``command``, or that
    command itself), the only way restarts in place keep their rules (never on exit 2, 78, 86, 87 or 143)
    and their bookkeeping. A ``command`` of the user's (``torchrun`` directly) keeps torchrun's defaults:
    a static rendezvous and no restart in place, so a failed process ends the attempt (the Job is
    recreated) and a divergence or a faulty rank is never retried on the same pods."""
    return spec.command is None or tuple(spec.command) == contract.IMAGE_ENTRYPOINT


def not_elastic(spec: Spec) -> str | None:
    """Why a job with ``spec.elastic`` will not resize (a ``command`` of the user's runs torchrun's own
    static rendezvous, not the launcher's elastic one), naming the field and the fix; None when it will."""
    if spec.elastic is None or runs_launcher(spec):
        return None
    return (
        f"spec.elastic: spec.command {list(spec.command or [])} runs torchrun's static rendezvous, not "
        "ddpjob's launcher, so this job does not resize: a lost or taken-away node fails the attempt and "
        "the whole gang restarts; leave spec.command out and put your script first in spec.args"
    )


def warnings(spec: Spec) -> list[str]:
    """What is valid but probably not what the author wants, each naming the field and the fix."""
    out = []
    custom = spec.command is not None or spec.args is not None
    if spec.sync_check.auto_instrument and custom and not sync_hook(spec):
        out.append(
            "spec.env PYTHONPATH: it comes from valueFrom, so the sync hook of spec.syncCheck.autoInstrument "
            "cannot be put in front of it and is off; give PYTHONPATH a value, or set autoInstrument: false "
            "to say so"
        )
    if lost := lost_checkpoints(spec):
        out.append(lost)
    if "trainer" in spec.given and (spec.command is not None or spec.args is not None):
        # spec.syncCheck is not ignored: it reaches any program as DDPJOB_SYNC_EVERY/DDPJOB_ON_DIVERGENCE,
        # which SyncHealth and its callbacks read (docs/your-code.md)
        out.append(
            "spec.trainer: ignored, because spec.command/spec.args run your own program instead of the "
            "built-in trainer, which alone reads it; remove it, or pass your program its settings in "
            "spec.args"
        )
    if reason := not_elastic(spec):
        out.append(reason)
    out.extend(storage_warnings(spec))
    return out


def lost_checkpoints(spec: Spec) -> str | None:
    """The warning for checkpoints that a gang restart would not find in a cluster (a pod-local emptyDir),
    or None. ``ddpjob local`` repeats it, saying why a restart there resumes all the same."""
    if spec.max_restarts == 0 or checkpoints_durable(spec):
        return None
    return (
        f"spec.checkpoint: checkpoints go to a pod-local emptyDir, so the {spec.max_restarts} gang "
        "restart(s) of spec.maxRestarts will start from step 0; give spec.checkpoint.volumeClaimTemplate "
        "(the operator creates a PersistentVolumeClaim), spec.checkpoint.volume or spec.checkpoint.s3"
    )


def storage_warnings(spec: Spec) -> list[str]:
    """A checkpoint claim a default cluster cannot give: the default StorageClasses of kind and minikube
    (local-path, hostpath) and of the clouds' block storage (EBS, Persistent Disk, Azure Disk) give only
    ReadWriteOnce, which pods on one node share (and a Multi-Attach error refuses a second node)."""
    claim = spec.checkpoint.claim if spec.checkpoint else None
    if claim is None:
        return []
    field, modes = "spec.checkpoint.volumeClaimTemplate", list(claim.access_modes)
    several = "a storageClassName whose class gives ReadWriteMany (NFS, EFS, Filestore, CephFS)"
    if "ReadWriteMany" in modes and claim.storage_class_name is None:
        instead = "accessModes [ReadWriteOnce]" if spec.nodes == 1 else several
        return [
            f"{field}.accessModes: {modes} from the cluster's default StorageClass, which on kind, minikube "
            "and the clouds' block storage gives only ReadWriteOnce (the claim would stay Pending); name "
            f"{instead}, or use {OBJECT_STORAGE}"
        ]
    if "ReadWriteOncePod" in modes and spec.nodes > 1:
        return [
            f"{field}.accessModes: {modes} lets one pod only mount the claim, but every one of the "
            f"{spec.nodes} pods mounts it; use [ReadWriteOnce] (pods on one node), {several}, or "
            f"{OBJECT_STORAGE}"
        ]
    if "ReadWriteMany" not in modes and spec.nodes > 1 and spec.device == "cuda":
        return [
            f"{field}.accessModes: {modes} lets the pods of one node only mount the claim, and these "
            f"{spec.nodes} pods with {spec.procs_per_node} GPU(s) each are likely on several nodes (the "
            f"others would fail with a Multi-Attach error); use {several}, or {OBJECT_STORAGE}"
        ]
    return []
