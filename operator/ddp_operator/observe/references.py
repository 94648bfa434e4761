"""The Secrets and ConfigMaps a DDPJob's spec names, each with the field that names it, and which of them
are absent from its namespace. Pure.

:func:`references` lists them: a fix then names the field (``spec.envFrom[0].secretRef``), and local mode
(which reads none) names them the same way. Before the pods can say it (a pod is scheduled first, and a
Job's pods may wait for quota or nodes), the operator looks the non-optional ones up
(:func:`to_look_up`: their metadata only, never their data) and :func:`~.observe.startup.absent` says which
are missing: Pending, ``ConfigError``, the fields and the fix. The pods are still created: the objects may
come later, and the kubelet then starts them. It looks up only in the namespaces it is told to
(``--check-references``: the chart's ``checkReferences.namespaces``, which grants the ``get`` there, and only
there); everywhere else, and by default, the kubelet's reason names a missing one (:mod:`.startup`) and the
operator reads no Secret or ConfigMap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddp_operator.api import reasons
from ddp_operator.api.spec import Spec

LOOK_UP_PHASES = ("", reasons.PENDING, reasons.RESTARTING)
"""While the DDPJob is in one of these phases (``""``: new), its references are looked up at each
reconcile; once its pods run, never again (a Secret deleted then would not stop a running container)."""


@dataclass(frozen=True)
class Reference:
    """A Secret or ConfigMap the spec names, and where."""

    kind: str
    """``Secret`` or ``ConfigMap``."""
    name: str
    field: str
    """The spec's field that names it (``spec.envFrom[0].secretRef``)."""
    optional: bool = False

    def __str__(self) -> str:
        return f"{self.kind} {self.name} ({self.field})"


def references(spec: Spec) -> tuple[Reference, ...]:
    """Every Secret and ConfigMap the spec names: the trainer's ``envFrom`` and ``env``, the checkpoint
    bucket's credentials, the pod template's volumes, image pull Secrets and init containers."""
    found = [*_container("spec", spec.env_from, spec.env)]
    s3 = spec.checkpoint.s3 if spec.checkpoint is not None else None
    if s3 is not None and s3.secret_name:
        found.append(Reference("Secret", s3.secret_name, "spec.checkpoint.s3.credentialsSecret"))
    template = spec.pod_template
    for i, volume in enumerate(template.volumes):
        found += _volume(f"spec.podTemplate.volumes[{i}]", volume)
    for i, secret in enumerate(template.image_pull_secrets):
        if secret.get("name"):
            found.append(Reference("Secret", str(secret["name"]), f"spec.podTemplate.imagePullSecrets[{i}]"))
    for i, init in enumerate(template.init_containers):
        found += _container(f"spec.podTemplate.initContainers[{i}]", init.get("envFrom"), init.get("env"))
    return tuple(found)


def _container(at: str, env_from: Any, env: Any) -> list[Reference]:
    found = []
    for i, source in enumerate(env_from or ()):
        for key, kind in (("secretRef", "Secret"), ("configMapRef", "ConfigMap")):
            if ref := source.get(key):
                found.append(Reference(kind, str(ref.get("name")), f"{at}.envFrom[{i}].{key}", _opt(ref)))
    for i, var in enumerate(env or ()):
        source = var.get("valueFrom") or {}
        for key, kind in (("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")):
            if ref := source.get(key):
                field = f"{at}.env[{i}].valueFrom.{key}"
                found.append(Reference(kind, str(ref.get("name")), field, _opt(ref)))
    return found


def _volume(at: str, volume: Mapping[str, Any]) -> list[Reference]:
    found = []
    if secret := volume.get("secret"):
        found.append(Reference("Secret", str(secret.get("secretName")), f"{at}.secret", _opt(secret)))
    if config := volume.get("configMap"):
        found.append(Reference("ConfigMap", str(config.get("name")), f"{at}.configMap", _opt(config)))
    for j, source in enumerate((volume.get("projected") or {}).get("sources") or ()):
        for key, kind in (("secret", "Secret"), ("configMap", "ConfigMap")):
            if ref := source.get(key):
                field = f"{at}.projected.sources[{j}].{key}"
                found.append(Reference(kind, str(ref.get("name")), field, _opt(ref)))
    return found


def _opt(ref: Mapping[str, Any]) -> bool:
    return bool(ref.get("optional"))


def named(kind: str, name: str, refs: Sequence[Reference]) -> str:
    """``Secret s3-creds (spec.envFrom[0].secretRef)``: the object and the fields of the spec that name
    it (as :class:`Reference` says one), or the object alone when the spec does not name it."""
    fields = [ref.field for ref in refs if (ref.kind, ref.name) == (kind, name)]
    return f"{kind} {name}" + (f" ({', '.join(fields)})" if fields else "")


def looked_up(namespaces: Sequence[str]) -> str:
    """What the operator's log says at start of its look-up, for ``--check-references`` (``namespaces``)."""
    if not namespaces:
        return (
            "Secret and ConfigMap references are checked from the kubelet's reasons only: the operator reads "
            "no Secret or ConfigMap, and names a missing one once a pod's kubelet says it (the chart's "
            "checkReferences.namespaces: named before any pod reaches a node, in those namespaces)"
        )
    return (
        f"Secret and ConfigMap references are looked up (their metadata only) in namespaces "
        f"{', '.join(sorted(set(namespaces)))} before the pods start; elsewhere they are checked from the "
        "kubelet's reasons only"
    )


def refused(kind: str, namespace: str, why: str) -> str:
    """What the operator's log says, once, when the API server refuses it a look-up it was told to make."""
    plural = "secrets" if kind == "Secret" else "configmaps"
    return (
        f"cannot look up {plural} in namespace {namespace} ({why}): a missing one there is named only once a "
        f"pod's kubelet says it (the chart's checkReferences.namespaces grants the get; --check-references "
        "alone does not)"
    )


def to_look_up(spec: Spec, phase: str) -> tuple[tuple[str, str], ...]:
    """The (kind, name) of each Secret and ConfigMap the spec needs (``optional`` ones left out) that the
    operator should look up now, given the DDPJob's ``phase``: each once, in the order the spec names them."""
    if phase not in LOOK_UP_PHASES:
        return ()
    return tuple(dict.fromkeys((ref.kind, ref.name) for ref in references(spec) if not ref.optional))
