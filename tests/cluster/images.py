"""What a container runtime takes from an image: its ENTRYPOINT and CMD, read from the project's Dockerfile.

The node agent ignores image contents (every pod runs in the agent's Python environment), but a container
that gives no ``command`` runs the image's ENTRYPOINT, and one that gives neither ``command`` nor ``args``
runs ENTRYPOINT + CMD. The chart's Deployment is such a container (``args: [operator, ...]`` against the
operator image's ``ENTRYPOINT ["ddpjob"]``). An image ``<anything>/<target>[:tag]`` whose last path part
names a stage of the Dockerfile (``ddpjob/operator:0.1.0`` → stage ``operator``) gets that stage's
ENTRYPOINT and CMD (inherited from the stage it is built ``FROM``, as Docker does). The monitoring
stack's upstream images (the Prometheus Operator, and Prometheus, Alertmanager and the operator's config
reloader as the operator puts them in its StatefulSets) run the binaries ``hack/monitoring/build.sh``
built from the same releases' Go modules, as their images' ENTRYPOINT does. Any other image has none,
and the pod must say ``command`` itself.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from .layout import REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"
MONITORING_BUILD = REPO_ROOT / "hack" / "monitoring" / "build.sh"
UPSTREAM = {
    "quay.io/prometheus-operator/prometheus-operator": "operator",
    "quay.io/prometheus/prometheus": "prometheus",
    "quay.io/prometheus/alertmanager": "alertmanager",
    "quay.io/prometheus-operator/prometheus-config-reloader": "prometheus-config-reloader",
}
"""Upstream image → the binary its ENTRYPOINT runs (``/bin/<binary>`` in the image)."""


@dataclass(frozen=True)
class ImageConfig:
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()


def parse_dockerfile(text: str) -> dict[str, ImageConfig]:
    """Stage name → its ENTRYPOINT and CMD (exec form only: the shell form is not used here)."""
    stages: dict[str, ImageConfig] = {}
    current: str | None = None
    config = ImageConfig()
    for raw in text.splitlines():
        line = raw.strip()
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            parts = rest.split()
            base = parts[0]
            current = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            config = stages.get(base, ImageConfig())
        elif word in ("ENTRYPOINT", "CMD"):
            value = tuple(str(v) for v in json.loads(rest))
            if word == "ENTRYPOINT":  # a new ENTRYPOINT resets an inherited CMD, as Docker does
                config = ImageConfig(entrypoint=value)
            else:
                config = ImageConfig(entrypoint=config.entrypoint, cmd=value)
        if current is not None:
            stages[current] = config
    return stages


@cache
def project_images() -> Mapping[str, ImageConfig]:
    return parse_dockerfile(DOCKERFILE.read_text())


@cache
def monitoring_bin() -> str | None:
    """Where the monitoring binaries are, if built (``build.sh --check`` builds nothing)."""
    found = subprocess.run(["bash", str(MONITORING_BUILD), "--check"], capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else None


def image_config(image: str, stages: Mapping[str, ImageConfig] | None = None) -> ImageConfig:
    """The config of ``image`` (``repo/path/<stage>[:tag][@digest]``), or an empty one."""
    repository = image.split("@", 1)[0]
    if ":" in repository.rsplit("/", 1)[-1]:  # a tag (a registry's port comes before a "/")
        repository = repository.rsplit(":", 1)[0]
    binary = UPSTREAM.get(repository)
    if binary is not None:
        folder = monitoring_bin()
        return ImageConfig(entrypoint=(f"{folder}/{binary}",)) if folder else ImageConfig()
    name = image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
    return (project_images() if stages is None else stages).get(name, ImageConfig())


def container_argv(
    container: Mapping[str, Any], stages: Mapping[str, ImageConfig] | None = None
) -> dict[str, Any]:
    """``container`` with ``command`` (and ``args``) filled in from its image, as the runtime would."""
    config = image_config(str(container.get("image") or ""), stages)
    command = list(container.get("command") or [])
    if command and config.entrypoint and command[0] == f"/bin/{Path(config.entrypoint[0]).name}":
        # an upstream image's binary named by its path in the image (the Prometheus Operator does so)
        return {**container, "command": [config.entrypoint[0], *command[1:]]}
    if command or not config.entrypoint:
        return dict(container)
    args: Sequence[str] = container.get("args") or list(config.cmd)
    return {**container, "command": list(config.entrypoint), "args": list(args)}
