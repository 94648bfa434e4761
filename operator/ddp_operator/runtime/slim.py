"""What the operator's indexes keep of an object: only what reconcile reads (memory: the indexes keep every
DDPJob, Job and pod of the cluster)."""

from __future__ import annotations

from typing import Any

import kopf

# Not metadata.managedFields nor kubectl's last-applied-configuration annotation (a second copy of the spec).
DROPPED_METADATA = frozenset({"managedFields"})
DROPPED_ANNOTATIONS = frozenset({"kubectl.kubernetes.io/last-applied-configuration"})


def slim(body: kopf.Body | dict[str, Any]) -> dict[str, Any]:
    """The object as the indexes keep it: without the metadata nobody reads."""
    out = dict(body)
    metadata = {k: v for k, v in (out.get("metadata") or {}).items() if k not in DROPPED_METADATA}
    annotations = metadata.get("annotations")
    if annotations and DROPPED_ANNOTATIONS.intersection(annotations):
        metadata["annotations"] = {k: v for k, v in annotations.items() if k not in DROPPED_ANNOTATIONS}
    out["metadata"] = metadata
    return out


def slim_job(body: kopf.Body | dict[str, Any]) -> dict[str, Any]:
    """A Job as its index keeps it: :func:`slim`, and without ``spec.template`` (the pod template, most of
    a Job's bytes): observe reads a Job's metadata, ``spec.suspend`` and ``status`` only."""
    out = slim(body)
    if isinstance(out.get("spec"), dict) and "template" in out["spec"]:
        out["spec"] = {k: v for k, v in out["spec"].items() if k != "template"}
    return out


POD_SPEC_KEPT = ("nodeName",)


def slim_pod(body: kopf.Body | dict[str, Any]) -> dict[str, Any]:
    """A pod as its index keeps it: :func:`slim`, and of its spec only what observe reads (``nodeName``):
    the spec (the injected environment, volumes, probes) is most of a pod's bytes."""
    out = slim(body)
    if isinstance(out.get("spec"), dict):
        out["spec"] = {k: v for k, v in out["spec"].items() if k in POD_SPEC_KEPT}
    return out
