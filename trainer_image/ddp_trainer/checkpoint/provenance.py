"""Who wrote a checkpoint, with which settings, whether it is intact, and whether this run may load it.

Pure and torch-free: :mod:`ddp_trainer.checkpoint.checkpoints` does the file and torch I/O around it.

A checkpoint file is one line of JSON (the header), a newline, then the torch payload::

    {"attempt":1,"format":"ddpjob-checkpoint/1","job":{"name":"mine","namespace":"team","uid":"…"},
     "payloadBytes":52311,"settings":{…},"settingsDigest":"…","sha256":"…","step":1500,"world":3}\\n<torch…>

``world`` is the world that wrote it (:mod:`ddp_trainer.checkpoint.fences`; absent before fences existed:
world 0, and in files of a writer that has none).

``sha256`` covers the header's other fields (canonical JSON: sorted keys, no spaces) and the payload, so a
flipped bit anywhere, a truncated file or a header that lost its payload is detected before anything is
loaded. :func:`choose` then decides, from the files newest first, what this run restores. Long because the
header's format, its checks and the decision that reads them are one contract, best read in one place.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ddp_trainer import contract

if TYPE_CHECKING:
    from ddp_trainer.core.config import TrainerConfig

FORMAT = "ddpjob-checkpoint/1"
MAX_HEADER_BYTES = 64 * 1024
"""A header line longer than this is not one (the file is not a ddpjob checkpoint)."""


@dataclass(frozen=True)
class Identity:
    """The DDPJob a run belongs to (``DDPJOB_NAMESPACE``, ``DDPJOB_NAME``, ``DDPJOB_UID``)."""

    namespace: str
    name: str
    uid: str

    def job(self) -> str:  # namespace/name
        return f"{self.namespace}/{self.name}"

    def __str__(self) -> str:
        if not (self.namespace or self.name or self.uid):
            return "a run outside any DDPJob (DDPJOB_NAME unset)"
        return f"DDPJob {self.job()} (uid {self.uid or 'unset'})"


def settings_of(
    config: TrainerConfig, world_size: int, *, precision: str, optimizer: str
) -> dict[str, str | int | float]:
    """The settings that shape the model, the optimizer state and the data order, by ``TrainerConfig``
    field name (plus ``world_size``, ``precision`` resolved for the device, and the optimizer's class).
    Resuming under other values would silently train something else: another architecture or data,
    another sample order (seed, batch size, accumulation and world size decide which micro-batches a rank
    skips and sees), other optimizer moments. ``steps``, the check and save schedules and the timeout are
    left out: changing them is a legitimate way to continue a job. The keys are
    :data:`contract.RECORDED_SETTINGS`', each read from the ``TrainerConfig`` field of its name."""
    # an elastic job resumes at any world size (its data order is the global batch's): 0 stands for any
    world = 0 if config.elastic_max_nodes else world_size
    computed: dict[str, str | int | float] = {"world_size": world, "precision": precision}
    computed["optimizer"] = optimizer
    return {
        name: computed[name] if name in computed else getattr(config, name)
        for name in contract.RECORDED_SETTINGS
    }


def digest(settings: Mapping[str, object]) -> str:
    """sha256 of the settings as canonical JSON."""
    return hashlib.sha256(_canonical(settings)).hexdigest()


def settings_diff(then: Mapping[str, object], now: Mapping[str, object]) -> list[str]:
    """``name: <then> in the checkpoint, <now> now`` for each setting that differs."""
    return [
        f"{key}: {then.get(key, '(unset)')!r} in the checkpoint, {now.get(key, '(unset)')!r} now"
        for key in sorted(set(then) | set(now))
        if then.get(key) != now.get(key)
    ]


@dataclass(frozen=True)
class Writer:
    """What this run stamps on its checkpoints, and compares others against."""

    identity: Identity
    settings: Mapping[str, str | int | float]
    attempt: int = contract.FIRST_ATTEMPT
    world: int = 0
    """The world this run is (:mod:`ddp_trainer.checkpoint.fences`), numbered when it restored; 0: none."""

    @property
    def settings_digest(self) -> str:
        """:func:`digest` of ``settings``."""
        return digest(self.settings)


@dataclass(frozen=True)
class Header:
    """A checkpoint's header, parsed and checked against its contents."""

    identity: Identity
    step: int
    settings: Mapping[str, Any]
    settings_digest: str
    attempt: int
    world: int = 0


def _canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def encode(writer: Writer, step: int, payload: bytes) -> bytes:
    """The file's bytes: the header line, then ``payload``."""
    ident = writer.identity
    fields: dict[str, Any] = {
        "format": FORMAT,
        "job": {"namespace": ident.namespace, "name": ident.name, "uid": ident.uid},
        "step": step,
        "attempt": writer.attempt,
        "settings": dict(writer.settings),
        "settingsDigest": writer.settings_digest,
        "payloadBytes": len(payload),
    }
    if writer.world:
        fields["world"] = writer.world
    body = _canonical(fields)
    fields["sha256"] = hashlib.sha256(body + b"\n" + payload).hexdigest()
    return _canonical(fields) + b"\n" + payload


def peek_identity(head: bytes) -> Identity | None:
    """The writer named by a file's first bytes, unverified (for pruning: whose is this file?); None when
    there is no readable header."""
    line, newline, _ = head.partition(b"\n")
    if not newline:
        return None
    try:
        return _identity(json.loads(line)["job"])
    except (ValueError, KeyError, TypeError):
        return None


def peek_world(head: bytes) -> int:
    """The world named by a file's first bytes, unverified (0: none, or no readable header)."""
    line, newline, _ = head.partition(b"\n")
    try:
        return int(json.loads(line).get("world", 0)) if newline else 0
    except (ValueError, TypeError, AttributeError):
        return 0


def _identity(job: Mapping[str, Any]) -> Identity:
    return Identity(str(job["namespace"]), str(job["name"]), str(job["uid"]))


def decode(data: bytes) -> tuple[Header, bytes]:
    """The header and payload of a file's bytes; ``ValueError`` says why it cannot be trusted."""
    line, newline, payload = data.partition(b"\n")
    if not newline or len(line) > MAX_HEADER_BYTES or not line.startswith(b"{"):
        raise ValueError("no checkpoint header (not written by this trainer, or truncated)")
    try:
        fields = json.loads(line)
        stated, expected = fields.pop("sha256"), int(fields["payloadBytes"])
        header = Header(
            _identity(fields["job"]),
            int(fields["step"]),
            dict(fields["settings"]),
            str(fields["settingsDigest"]),
            int(fields["attempt"]),
            int(fields.get("world", 0)),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"unreadable header ({type(err).__name__}: {err})") from None
    if fields.get("format") != FORMAT:
        raise ValueError(f"format {fields.get('format')!r}, expected {FORMAT!r}")
    if len(payload) != expected:
        raise ValueError(f"truncated: {len(payload)} of {expected} payload bytes")
    actual = hashlib.sha256(_canonical(fields) + b"\n" + payload).hexdigest()
    if actual != stated:
        raise ValueError(f"contents do not match their sha256 ({actual[:12]}…, header says {stated[:12]}…)")
    return header, payload


@dataclass(frozen=True)
class Candidate:
    """One checkpoint file as the scan found it: intact (``header`` and ``payload``) or not (``problem``)."""

    file: str
    step: int
    header: Header | None = None
    payload: bytes | None = field(default=None, repr=False)
    problem: str = ""


Action = Literal["fresh", "resume", "warm", "refuse"]


@dataclass(frozen=True)
class Choice:
    """What this run restores; broadcast from rank 0 so every rank acts alike."""

    action: Action
    step: int = 0
    """The restored checkpoint's step (0 unless ``resume`` or ``warm``)."""
    file: str = ""
    payload: bytes | None = field(default=None, repr=False)
    skipped: tuple[str, ...] = ()
    """Files passed over, each ``<file>: <why>``."""
    warm_from: str = ""
    """``namespace/name`` of the warm start's source."""
    reason: str = ""
    """For ``refuse``: :data:`contract.FOREIGN_CHECKPOINT` or :data:`contract.SETTINGS_CHANGED`."""
    message: str = ""
    """For ``refuse``: why, naming both sides."""
    world: int = 0
    """The world this run is, as its fence numbered it (0: no fence recorded)."""


def choose(
    found: Iterable[Candidate],
    me: Writer,
    *,
    warm_start_from: str = "",
    where: str = "",
    loadable: Callable[[Candidate], str] = lambda candidate: "",
    stale: Callable[[Header], str] = lambda header: "",
) -> Choice:
    """Decide from the checkpoint files, newest first, what to restore. ``found`` is consumed lazily: the
    scan stops at this job's newest intact checkpoint.

    * This job's (same namespace, name and uid) newest intact checkpoint is resumed if it was written with
      the same settings, and refused (``SettingsChanged``) if not. Corrupt files before it are skipped.
    * No intact checkpoint of this job, but one of the DDPJob that ``warm_start_from`` names (same
      namespace): a warm start from its newest (weights only).
    * Otherwise another job's intact checkpoint is refused (``ForeignCheckpoint``); nothing intact at all
      is a fresh start. ``loadable`` is asked (``""``: yes, else why not) before a file is chosen.
    * A file ``stale`` rules out (``""``: it does not; else why) is skipped before anything else: a stale
      world's late checkpoint (:func:`ddp_trainer.checkpoint.fences.stale`) is nobody's to resume.
    """
    skipped: list[str] = []
    foreign: tuple[Candidate, int] | None = None  # another job's newest, and how many skips preceded it
    warm: tuple[Candidate, int] | None = None  # the warm start source's newest, likewise
    for c in found:
        if c.header is None or c.problem:
            skipped.append(f"{c.file}: {c.problem or 'no header'}")
            continue
        if why := stale(c.header):
            skipped.append(f"{c.file}: {why}")
            continue
        writer = c.header.identity
        if writer == me.identity:
            if c.header.settings_digest != me.settings_digest:
                return _refuse_settings(c, me, where, skipped)
            problem = loadable(c)
            if not problem:
                return Choice("resume", c.step, c.file, c.payload, tuple(skipped))
            skipped.append(f"{c.file}: {problem}")
        elif warm_start_from and writer.namespace == me.identity.namespace and writer.name == warm_start_from:
            if warm is None:
                warm = (c, len(skipped))
        else:
            foreign = foreign or (c, len(skipped))
            skipped.append(f"{c.file}: written by {writer}")
    if warm is not None:
        source, before = warm
        assert source.header is not None
        problem = loadable(source)
        if not problem:
            job = source.header.identity.job()
            return Choice("warm", source.step, source.file, source.payload, tuple(skipped[:before]), job)
        skipped.insert(before, f"{source.file}: {problem}")
    if foreign is not None:
        c, before = foreign
        return _refuse_foreign(c, me, where, warm_start_from, skipped[:before])
    return Choice("fresh", skipped=tuple(skipped))


def _in(file: str, where: str) -> str:
    return f"checkpoint {file} in {where}" if where else f"checkpoint {file}"


def _refuse_settings(c: Candidate, me: Writer, where: str, skipped: list[str]) -> Choice:
    assert c.header is not None
    changes = settings_diff(c.header.settings, me.settings) or ["the settings digest differs"]
    message = (
        f"{_in(c.file, where)} was written by this job ({me.identity}) at step {c.step} with other "
        f"settings: {'; '.join(changes)}; refusing to resume it (run with the checkpoint's settings, or "
        "start over with an empty checkpoint folder)"
    )
    return Choice("refuse", c.step, c.file, None, tuple(skipped), "", contract.SETTINGS_CHANGED, message)


def _refuse_foreign(c: Candidate, me: Writer, where: str, warm_start_from: str, skipped: list[str]) -> Choice:
    assert c.header is not None
    theirs = c.header.identity
    if theirs.namespace != me.identity.namespace:
        hint = "warmStartFrom works within one namespace: give this job its own checkpoint volume"
    elif warm_start_from:
        hint = (
            f"spec.checkpoint.warmStartFrom names {warm_start_from!r}, which has no intact checkpoint "
            f"here; set it to {theirs.name!r} to start from this one's weights"
        )
    else:
        hint = (
            f"set spec.checkpoint.warmStartFrom: {theirs.name} (--warm-start-from={theirs.name}) to start "
            "from its weights, or give this job its own checkpoint volume"
        )
    message = (
        f"{_in(c.file, where)} was written by {theirs} at step {c.step}; this is {me.identity}: "
        f"refusing to resume another job's checkpoint ({hint})"
    )
    return Choice("refuse", c.step, c.file, None, tuple(skipped), "", contract.FOREIGN_CHECKPOINT, message)
