"""What a container runtime takes from an image, for the node agents' pods: the monitoring stack's upstream
images (the Prometheus Operator, and Prometheus, Alertmanager and the operator's config reloader as the
operator puts them in its StatefulSets) run the binaries ``hack/monitoring/build.sh`` built from the same
releases' Go modules, as their images' ENTRYPOINT does. The node agents ignore any other image's contents
(every pod runs in the agent's Python environment) and a pod must say its ``command`` itself; the project's
own images run on the real nodes only (testcluster/realnode.py), from the archives ``make images`` built.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from .layout import REPO_ROOT

MONITORING_BUILD = REPO_ROOT / "hack" / "monitoring" / "build.sh"
UPSTREAM = {
    "quay.io/prometheus-operator/prometheus-operator": "operator",
    "quay.io/prometheus/prometheus": "prometheus",
    "quay.io/prometheus/alertmanager": "alertmanager",
    "quay.io/prometheus-operator/prometheus-config-reloader": "prometheus-config-reloader",
}
"""Upstream image → the binary its ENTRYPOINT runs (``/bin/<binary>`` in the image)."""


@cache
def monitoring_bin() -> str | None:
    """Where the monitoring binaries are, if built (``build.sh --check`` builds nothing)."""
    found = subprocess.run(["bash", str(MONITORING_BUILD), "--check"], capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else None


def upstream_binary(image: str) -> str | None:
    """The binary an upstream monitoring image's ENTRYPOINT runs, built here; None for any other image
    (or when the monitoring stack is not built)."""
    repository = image.split("@", 1)[0]
    if ":" in repository.rsplit("/", 1)[-1]:  # a tag (a registry's port comes before a "/")
        repository = repository.rsplit(":", 1)[0]
    binary = UPSTREAM.get(repository)
    folder = monitoring_bin() if binary else None
    return f"{folder}/{binary}" if folder else None


def container_argv(container: Mapping[str, Any]) -> dict[str, Any]:
    """``container`` with ``command`` filled in from its upstream image, as the runtime would."""
    entrypoint = upstream_binary(str(container.get("image") or ""))
    command = list(container.get("command") or [])
    if entrypoint is None:
        return dict(container)
    if command and command[0] == f"/bin/{Path(entrypoint).name}":
        # the binary named by its path in the image (the Prometheus Operator does so)
        return {**container, "command": [entrypoint, *command[1:]]}
    if command:
        return dict(container)
    return {**container, "command": [entrypoint], "args": list(container.get("args") or [])}
