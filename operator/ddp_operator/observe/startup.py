"""Why a pod of the current attempt cannot start, in the kubelet's own words, and what the user must do.
Pure.

The kubelet says it in each container's ``status.containerStatuses[].state.waiting`` (and
``initContainerStatuses``): a ``reason`` (``ImagePullBackOff``, ``ErrImagePull``, ``InvalidImageName``,
``CreateContainerConfigError``, ``CreateContainerError``, ``RunContainerError``) and a ``message``.
:func:`first_failure` finds the first of them (by completion index, init containers first: they run
first) and says whether it is *final*: it will not fix itself in this attempt (an image reference that does
not parse, a registry that has no such image or refuses it, a Secret or ConfigMap that is absent), so the
user must act; the operator keeps watching, and the pods start once the cause is gone.
:mod:`ddp_operator.decide.decision` puts it in the ``Ready`` condition and the REASON column.

The Secrets and ConfigMaps a spec names, each with its field, are :mod:`~.observe.references`'s: the fix
names the field.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddp_operator.api import names, reasons
from ddp_operator.api.spec import Spec
from ddp_operator.observe.references import Reference, named, references

REASONS: Mapping[str, str] = {
    "ImagePullBackOff": reasons.IMAGE_PULL_BACK_OFF,
    "ErrImagePull": reasons.ERR_IMAGE_PULL,
    "InvalidImageName": reasons.INVALID_IMAGE_NAME,
    "ErrImageNeverPull": reasons.ERR_IMAGE_NEVER_PULL,
    "CreateContainerConfigError": reasons.CONFIG_ERROR,
    "CreateContainerError": reasons.CONTAINER_ERROR,
    "RunContainerError": reasons.CONTAINER_ERROR,
}
"""The kubelet's waiting reasons that mean a container cannot start → the DDPJob's reason."""
PULLS = (reasons.ERR_IMAGE_PULL, reasons.IMAGE_PULL_BACK_OFF)
"""One cause, two names: the kubelet alternates between them as it retries a failing pull."""
MESSAGE_CHARS = 700
"""The kubelet's message is quoted up to this length (a runtime's error can be long)."""
APPLY_AGAIN = "a changed spec applies at the next attempt, so delete this DDPJob and apply it again"

_NOT_FOUND = re.compile(r'\b(secret|configmap)s? "([^"]+)" not found', re.IGNORECASE)
_NO_KEY = re.compile(r"couldn't find key (\S+) in (Secret|ConfigMap) (\S+)", re.IGNORECASE)
_ABSENT = re.compile(r"\bnot found\b|does not exist|manifest unknown|name unknown", re.IGNORECASE)
_REFUSED = re.compile(
    r"unauthorized|denied|forbidden|authentication required|authorization failed|\b40[13]\b", re.IGNORECASE
)


@dataclass(frozen=True)
class StartupFailure:
    """The first container of the attempt that cannot start: where, the kubelet's words, and the fix."""

    pod: str
    container: str
    """The container (empty: the pod's volumes, before any container: :mod:`~.observe.mounts`)."""
    init: bool
    waiting: str
    """The kubelet's reason, verbatim (``CreateContainerConfigError``; ``FailedMount``)."""
    message: str
    """The kubelet's message, verbatim (up to :data:`MESSAGE_CHARS`)."""
    reason: str
    """The DDPJob's reason (``ConfigError``): the REASON column."""
    final: bool
    """It will not fix itself in this attempt: the user must act."""
    fix: str
    subject: str
    """What it is about (an image, a Secret): a new cause is a new event, a retry of the same is not."""

    @property
    def said(self) -> str:
        where = f" init container {self.container}" if self.init else f" container {self.container}"
        quoted = f": {self.message}" if self.message else " (the kubelet gives no message)"
        then = "it will not fix itself: " if self.final else ""
        what = f"Job {self.pod}" if self.waiting in ("FailedCreate", NOT_FOUND) else f"pod {self.pod}"
        return f"{what}{where if self.container else ''}: {self.waiting}{quoted}; {then}{self.fix}"


def same_cause(reason: str, other: str) -> bool:
    """Two reasons of one cause (a failing pull is ``ErrImagePull``, then ``ImagePullBackOff``, again)."""
    return reason == other or (reason in PULLS and other in PULLS)


def node_rank(pod: Mapping[str, Any]) -> int:
    """The pod's completion index (-1 when it has none)."""
    try:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        return int(annotations.get(names.COMPLETION_INDEX_ANNOTATION, "-1"))
    except ValueError:
        return -1


def first_failure(pods: Sequence[Mapping[str, Any]], refs: Sequence[Reference] = ()) -> StartupFailure | None:
    """The first container of ``pods`` (one attempt's, as the API server returns them) that the kubelet
    cannot start, or None. ``refs``: what the spec names (:func:`references`), so the fix names the
    field."""
    for pod in sorted(pods, key=lambda p: (node_rank(p), str((p.get("metadata") or {}).get("name", "")))):
        if pod.get("metadata", {}).get("deletionTimestamp"):
            continue
        status = pod.get("status") or {}
        for init, key in ((True, "initContainerStatuses"), (False, "containerStatuses")):
            for container in status.get(key) or []:
                waiting = (container.get("state") or {}).get("waiting") or {}
                if waiting.get("reason") in REASONS:
                    return _failure(pod, container, init, waiting, refs)
    return None


def _failure(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    init: bool,
    waiting: Mapping[str, Any],
    refs: Sequence[Reference],
) -> StartupFailure:
    said = str(waiting["reason"])
    message = str(waiting.get("message") or "").strip()[:MESSAGE_CHARS]
    name = str(container.get("name", "?"))
    reason = REASONS[said]
    metadata = pod.get("metadata") or {}
    namespace = metadata.get("namespace") or "default"
    pod_name = str(metadata.get("name", "?"))
    if reason == reasons.CONFIG_ERROR:
        final, fix, subject = _config(message, refs, namespace, pod_name)
    elif said == "RunContainerError":  # restartPolicy Never: the pod fails, and the gang with it
        fix = f"the runtime could not start it: check `kubectl describe pod {pod_name} -n {namespace}`"
        final, fix, subject = False, f"{fix} (its command and mounts)", message
    elif reason == reasons.CONTAINER_ERROR:
        final, fix, subject = False, _look(pod_name, namespace, "its command and mounts"), message
    else:
        # the kubelet copies the spec's image into a waiting container's status (the index drops pod specs)
        image = str(container.get("image") or "") or _image(pod, name, init)
        final, fix = _pull(reason, message, image, _image_field(name, init), refs)
        subject = image
    return StartupFailure(pod_name, name, init, said, message, reason, final, fix, subject)


def _look(pod: str, namespace: str, what: str) -> str:
    return f"the kubelet retries; if it persists, see `kubectl describe pod {pod} -n {namespace}` ({what})"


def _config(message: str, refs: Sequence[Reference], namespace: str, pod: str) -> tuple[bool, str, str]:
    """``CreateContainerConfigError``: a missing Secret or ConfigMap (or key) is final; the rest is not."""
    if found := missing(message, refs, namespace):
        return True, *found
    if "runAsNonRoot" in message or "non-root" in message:
        fix = (
            "the image runs as root and the pod asks for a non-root user: set a non-root runAsUser in "
            f"spec.podTemplate.securityContext, or use an image whose USER is not root ({APPLY_AGAIN})"
        )
        return True, fix, message
    return False, _look(pod, namespace, "its Events name the Secret, ConfigMap or mount"), message


def missing(message: str, refs: Sequence[Reference], namespace: str) -> tuple[str, str] | None:
    """The fix and the subject when the kubelet's ``message`` says a Secret or ConfigMap (or a key in
    one) is missing, else None: the kubelet's ``secret "x" not found`` (an environment's or a volume's),
    ``couldn't find key K in Secret ns/x``."""
    if found := _NOT_FOUND.search(message):
        kind = "Secret" if found[1].lower() == "secret" else "ConfigMap"
        subject = named(kind, found[2], refs)
        return (
            f"create {subject} in namespace {namespace}, or correct the name; the pods start once it exists",
            subject,
        )
    if found := _NO_KEY.search(message):
        key, kind, full = found[1], found[2], found[3]
        subject = f"key {key} to {named(kind, full.split('/', 1)[-1], refs)}"
        return f"add {subject}, or correct the key; the pods start once it is there", subject
    return None


def _image(pod: Mapping[str, Any], name: str, init: bool) -> str:
    for container in (pod.get("spec") or {}).get("initContainers" if init else "containers") or []:
        if container.get("name") == name:
            return str(container.get("image") or "")
    return ""


def _image_field(name: str, init: bool) -> str:
    """Where the container's image comes from."""
    if name == names.CONTAINER_NAME and not init:
        return "spec.image"
    if init and name == names.SYNC_HOOK_INIT_CONTAINER:
        return "the ddpjob trainer image (the sync hook's init container: spec.syncCheck.autoInstrument)"
    return f"the image of init container {name} (spec.podTemplate.initContainers)" if init else "its image"


def _pull(reason: str, message: str, image: str, field: str, refs: Sequence[Reference]) -> tuple[bool, str]:
    """An image that cannot be pulled: final when the reference does not parse, is not on the node under
    ``Never``, or the registry says it has no such image or refuses it; else the kubelet retries."""
    sync_hook = field.startswith("the ddpjob trainer image")
    change = (
        "mirror it where the nodes can pull it, or set spec.syncCheck.autoInstrument: false"
        if sync_hook
        else f"correct {field} ({APPLY_AGAIN})"
    )
    if reason == reasons.INVALID_IMAGE_NAME:
        return True, f"{image} is not a valid image reference: {change}"
    if reason == reasons.ERR_IMAGE_NEVER_PULL:
        return True, f"{image} is not on the node and its imagePullPolicy is Never: load it onto the nodes"
    pull_secrets = [str(ref) for ref in refs if ref.field.startswith("spec.podTemplate.imagePullSecrets")]
    if _REFUSED.search(message):
        credentials = (
            f"check that {', '.join(pull_secrets)} exists and holds this registry's credentials"
            if pull_secrets
            else f"give the pods its credentials in spec.podTemplate.imagePullSecrets ({APPLY_AGAIN})"
        )
        return True, (
            f"the registry refuses {image} (it has no such image, or it is private): check {field}; for a "
            f"private registry, {credentials}"
        )
    if _ABSENT.search(message):
        return True, f"the registry has no image {image}: push it, or {change}"
    return False, (
        f"the kubelet retries the pull with back-off; if it persists, check that the nodes reach the "
        f"registry of {image} and {field}"
    )


def absent(
    spec: Spec, missing: Collection[tuple[str, str]], job: str, refs: Sequence[Reference] | None = None
) -> StartupFailure | None:
    """The references ``missing`` from the namespace (what the operator's look-up found absent:
    :func:`~.observe.references.to_look_up`) as the start-up failure of Job ``job``, or None. ``refs``: the
    spec's references where the caller has them already (:func:`~.observe.references.references`)."""
    refs = references(spec) if refs is None else refs
    needed = dict.fromkeys((r.kind, r.name) for r in refs if not r.optional)
    wanted = [key for key in needed if key in missing]
    if not wanted:
        return None
    subject = ", ".join(named(kind, name, refs) for kind, name in wanted)
    one = len(wanted) == 1
    message = f"{subject} {'does' if one else 'do'} not exist in namespace {spec.namespace}"
    fix = (
        f"create {'it' if one else 'them'} in namespace {spec.namespace}, or correct the name; the pods "
        f"start once {'it exists' if one else 'they exist'}"
    )
    return StartupFailure(job, "", False, NOT_FOUND, message, reasons.CONFIG_ERROR, True, fix, subject)


NOT_FOUND = "NotFound"
"""The start-up failure's ``waiting``: the operator's own look-up found no such object (no kubelet has
said anything yet)."""
