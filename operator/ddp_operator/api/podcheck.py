"""What the API server refuses when the Job (or the checkpoint claim) is created, though the DDPJob's own
schema cannot say it.

A CRD's CEL has no resource quantities in every server this project supports (nor in cel-python), and
Kubernetes' label-key grammar is a poor fit for it; so ``ddpjob validate`` checks these here, on the
defaulted document, with the API server's words. On a cluster the operator goes further: whatever else
the server refuses when the rendered objects are created is reported on the DDPJob at once, and what was
created of the attempt before the refused object is deleted again, so nothing is left half-way
(``runtime/reconcile.carry_out``). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

from ddp_operator.api.kubelet import ResolveError, parse_quantity
from ddp_operator.api.names import CHECKPOINT_VOLUME, SHM_VOLUME
from ddp_operator.api.schema import Problem, join, show

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_KEY_WORDS = (
    "a label key is an optional DNS subdomain prefix (at most 253 characters) and '/', then a name of at "
    "most 63 characters: letters, digits, '-', '_' and '.', alphanumeric at both ends, e.g. team or "
    "example.com/team"
)


def problems(doc: Mapping[str, Any]) -> list[Problem]:
    """Every such problem of a defaulted DDPJob document whose schema is valid."""
    spec = doc.get("spec", {})
    template = spec.get("podTemplate", {})
    return [
        *_namespace(doc.get("metadata", {})),
        *_nonnegative(spec.get("resources", {})),
        *_sizes(spec),
        *_requests_within_limits(spec.get("resources", {})),
        *_labels("spec.podTemplate.labels", template.get("labels", {}), values=True),
        *_labels("spec.podTemplate.nodeSelector", template.get("nodeSelector", {}), values=True),
        *_mounts(template),
    ]


def _namespace(metadata: Mapping[str, Any]) -> Iterator[Problem]:
    namespace = metadata.get("namespace")
    if isinstance(namespace, str) and (len(namespace) > 63 or not _DNS_LABEL.match(namespace)):
        yield Problem(
            "metadata.namespace",
            f"Invalid value: {show(namespace)}: a namespace is a DNS-1123 label: at most 63 lowercase "
            "letters, digits and '-', alphanumeric at both ends",
        )


def is_dns_subdomain(name: str) -> bool:
    """Kubernetes' rule for most object names (RFC 1123 subdomain): at most 253 characters, lowercase
    letters, digits, '-' and '.', alphanumeric at both ends."""
    return len(name) <= 253 and bool(_DNS_SUBDOMAIN.match(name))


def _quantity(value: Any) -> Decimal | None:
    try:
        return parse_quantity(value)
    except ResolveError:
        return None  # the schema's pattern has said so already


def _nonnegative(resources: Mapping[str, Any]) -> Iterator[Problem]:
    """The CRD's quantity pattern (Kubernetes' own) takes a sign; a container's requests and limits may not
    be negative, which the API server says only of the Job."""
    for kind in ("limits", "requests"):
        for name, value in resources.get(kind, {}).items():
            if (quantity := _quantity(value)) is not None and quantity < 0:
                yield Problem(
                    join(f"spec.resources.{kind}", name),
                    f"Invalid value: {show(str(value))}: must be greater than or equal to 0",
                )


def _sizes(spec: Mapping[str, Any]) -> Iterator[Problem]:
    """/dev/shm's size limit may not be negative (the Job's emptyDir), nor a claim's size zero or less (the
    PersistentVolumeClaim's storage request)."""
    shm = spec.get("shmSize")
    if (quantity := _quantity(shm)) is not None and quantity < 0:
        yield Problem("spec.shmSize", f"Invalid value: {show(str(shm))}: must be greater than or equal to 0")
    size = spec.get("checkpoint", {}).get("volumeClaimTemplate", {}).get("size")
    if size is not None and (quantity := _quantity(size)) is not None and quantity <= 0:
        yield Problem(
            "spec.checkpoint.volumeClaimTemplate.size",
            f"Invalid value: {show(str(size))}: must be greater than zero",
        )


def _requests_within_limits(resources: Mapping[str, Any]) -> Iterator[Problem]:
    limits, requests = resources.get("limits", {}), resources.get("requests", {})
    for name, request in requests.items():
        if name not in limits:
            continue
        request_quantity, limit_quantity = _quantity(request), _quantity(limits[name])
        if request_quantity is not None and limit_quantity is not None and request_quantity > limit_quantity:
            yield Problem(
                "spec.resources.requests",  # the API server names the map, not the key
                f"Invalid value: {show(str(request))}: {join('spec.resources.requests', name)} must be less "
                "than or equal to the limit "
                f"{join('spec.resources.limits', name)} {show(str(limits[name]))}",
            )


def label_key_valid(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return len(name) <= 63 and bool(_NAME.match(name))


def _labels(path: str, labels: Mapping[str, Any], *, values: bool) -> Iterator[Problem]:
    for key, value in labels.items():
        if not label_key_valid(key):
            yield Problem(join(path, key), f"Invalid value: {show(key)}: {_KEY_WORDS}")
        elif values and isinstance(value, str) and not _LABEL_VALUE.match(value):
            yield Problem(
                join(path, key),
                f"Invalid value: {show(value)}: a label value is empty or letters, digits, '-', '_' and '.', "
                "alphanumeric at both ends",
            )


def _mounts(template: Mapping[str, Any]) -> Iterator[Problem]:
    known = {SHM_VOLUME, CHECKPOINT_VOLUME}
    known |= {volume.get("name") for volume in template.get("volumes", [])}
    for index, mount in enumerate(template.get("volumeMounts", [])):
        if mount.get("name") not in known:
            names = ", ".join(show(name) for name in sorted(n for n in known if isinstance(n, str)))
            yield Problem(
                join(join("spec.podTemplate.volumeMounts", index), "name"),
                f"Not found: {show(mount.get('name'))}: no volume of that name; add it to "
                f"spec.podTemplate.volumes (volumes here: {names})",
            )
