"""A DDPJob document → a frozen, defaulted, validated ``Spec``.

The verdict is the API server's: the CRD's own schema and CEL rules (``schema.validate``), plus the checks
the server does before it ever reaches the schema (apiVersion, kind, a name) and of every object's name;
once the server would take the DDPJob, what it would refuse of the Job (``podcheck``). Every problem names
the field, the value and what would be accepted; ``SpecError`` carries all of them at once.
:mod:`.spec_warnings` says what is valid but probably unintended (restarts that would start from step 0,
say); :mod:`.crd_fields` reads the dataclasses from the CRD object by name.

Long because the dataclasses mirror the CRD's spec one to one; the logic is ``parse`` and ``_build``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from ddp_operator.api import crd, podcheck, schema
from ddp_operator.api.crd_fields import from_crd
from ddp_operator.api.schema import Problem
from ddp_trainer import contract


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


def defaulted(doc: Mapping[str, Any], openapi: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The document with the CRD's defaults applied, as the API server stores it (``openapi``: the CRD's
    schema, :func:`~ddp_operator.api.crd.openapi_schema`, where the caller has it already)."""
    result: dict[str, Any] = schema.apply_defaults(crd.openapi_schema() if openapi is None else openapi, doc)
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
    openapi = crd.openapi_schema()  # asked once: the defaults, the validation and the fields go by it
    full = defaulted(doc, openapi)
    problems = [] if admitted else [*_name_problems(doc["metadata"]["name"]), *schema.validate(openapi, full)]
    if not admitted and not problems:
        problems = podcheck.problems(full)  # what the server says of the Job, once it takes the DDPJob
    if problems:
        raise SpecError(problems, _label(doc, source))
    try:
        given = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
        return replace(_build(full, openapi), given=frozenset(given))
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


def _build(doc: Mapping[str, Any], openapi: Mapping[str, Any]) -> Spec:
    s, metadata = doc["spec"], doc["metadata"]
    read = from_crd(Spec, s, openapi["properties"]["spec"])
    read["backend"] = read["backend"] or ("nccl" if read["device"] == "cuda" else "gloo")
    return Spec(
        **read,
        name=metadata["name"],
        namespace=metadata.get("namespace") or DEFAULT_NAMESPACE,
        uid=metadata.get("uid"),
    )


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
