"""DDPJob documents for the refusal tests: a valid base and the same with fields set."""

from __future__ import annotations

import copy
from typing import Any

BASE: dict[str, Any] = {
    "apiVersion": "ddpjob.io/v1alpha1",
    "kind": "DDPJob",
    "metadata": {"name": "demo"},
    "spec": {"nodes": 2, "device": "cpu"},
}


def doc_with(**fields: Any) -> dict[str, Any]:
    """BASE with top-level spec fields set (and metadata.namespace from ``namespace``)."""
    doc = copy.deepcopy(BASE)
    if "namespace" in fields:
        doc["metadata"]["namespace"] = fields.pop("namespace")
    doc["spec"].update(fields)
    return doc


VOLUME = {"name": "data", "emptyDir": {}}
