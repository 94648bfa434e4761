"""What the API server refuses when the Job is created, though the DDPJob's own schema cannot say it.

A CRD's CEL has no resource quantities in every server this project supports (nor in cel-python), and
Kubernetes' label-key grammar is a poor fit for it; so ``ddpjob validate`` checks these here, on the
defaulted document, with the API server's words. On a cluster the operator goes further: it creates the
rendered objects with ``dryRun`` first, so whatever else the server refuses is reported on the DDPJob at
once and nothing is created half-way (``apply``). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from .kubelet import ResolveError, parse_quantity
from .names import CHECKPOINT_VOLUME, SHM_VOLUME
from .schema import Problem, join, show

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


def _requests_within_limits(resources: Mapping[str, Any]) -> Iterator[Problem]:
    limits, requests = resources.get("limits", {}), resources.get("requests", {})
    for name, request in requests.items():
        if name not in limits:
            continue
        try:
            above = parse_quantity(request) > parse_quantity(limits[name])
        except ResolveError:
            continue  # the schema's pattern has said so already
        if above:
            yield Problem(
                join("spec.resources.requests", name),
                f"Invalid value: {show(str(request))}: must be less than or equal to the limit "
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
