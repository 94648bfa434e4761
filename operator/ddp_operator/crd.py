"""The DDPJob CustomResourceDefinition: where it lives, and its parts.

The chart's ``crds/`` file is the one source of truth. ``manifests/crd.yaml`` is generated from it
(``python -m ddp_operator.crd --write-manifests``, run by ``make manifests``) and a test keeps them equal.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Any

import yaml

GROUP = "ddpjob.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DDPJob"
PLURAL = "ddpjobs"

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_CRD = REPO_ROOT / "charts" / "ddpjob-operator" / "crds" / f"{PLURAL}.{GROUP}.yaml"
MANIFEST_CRD = REPO_ROOT / "manifests" / "crd.yaml"

_MANIFEST_HEADER = "# Generated from charts/ddpjob-operator/crds/ by `make manifests`; do not edit.\n"


def crd_text() -> str:
    """The CRD exactly as the chart ships it."""
    if not CHART_CRD.is_file():
        raise FileNotFoundError(f"the DDPJob CRD is not at {CHART_CRD}; is this a complete ddpjob checkout?")
    return CHART_CRD.read_text()


@functools.cache
def crd() -> dict[str, Any]:
    """The CRD as data."""
    loaded: dict[str, Any] = yaml.safe_load(crd_text())
    return loaded


def openapi_schema(version: str = VERSION) -> dict[str, Any]:
    """The structural schema of one served version."""
    for served in crd()["spec"]["versions"]:
        if served["name"] == version:
            schema: dict[str, Any] = served["schema"]["openAPIV3Schema"]
            return schema
    raise KeyError(f"the CRD serves no version {version!r}")


def manifest_text() -> str:
    """What manifests/crd.yaml must contain: every CRD of the chart (DDPJob's first, then Kopf's peering)."""
    files = [CHART_CRD, *sorted(p for p in CHART_CRD.parent.glob("*.yaml") if p != CHART_CRD)]
    bodies = []
    for path in files:
        body = "".join(
            line for line in path.read_text().splitlines(keepends=True) if not line.startswith("#")
        )
        bodies.append(body.strip("\n").removeprefix("---\n") + "\n")
    return _MANIFEST_HEADER + "---\n".join(bodies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write-manifests", action="store_true", help="regenerate manifests/crd.yaml")
    if parser.parse_args().write_manifests:
        MANIFEST_CRD.parent.mkdir(parents=True, exist_ok=True)
        MANIFEST_CRD.write_text(manifest_text())
        print(f"wrote {MANIFEST_CRD.relative_to(REPO_ROOT)}")
    else:
        print(crd_text(), end="")


if __name__ == "__main__":
    main()
