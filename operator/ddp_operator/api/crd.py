"""The DDPJob CustomResourceDefinition: where it lives, and its parts.

``ddp_operator/api/crds/ddpjobs.ddpjob.io.yaml`` is the one source of truth, shipped as package data so that
an installed wheel (no checkout) runs ``ddpjob crd`` and ``ddpjob validate``. The chart's ``crds/`` copy
and ``manifests/crd.yaml`` are generated from it (``python -m ddp_operator.api.crd --write-manifests``, run by
``make manifests``, in a checkout) and a test keeps them equal.
"""

from __future__ import annotations

import argparse
import functools
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

GROUP = "ddpjob.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DDPJob"
PLURAL = "ddpjobs"

CRD_FILE = f"{PLURAL}.{GROUP}.yaml"
# Only in a checkout: where `--write-manifests` writes the generated copies.
REPO_ROOT = Path(__file__).resolve().parents[3]
CHART_CRDS = REPO_ROOT / "charts" / "ddpjob-operator" / "crds"
MANIFEST_CRD = REPO_ROOT / "manifests" / "crd.yaml"

_CHART_HEADER = (
    "# Generated from operator/ddp_operator/api/crds/ by `make manifests`; do not edit (edit that file).\n"
)
_MANIFEST_HEADER = "# Generated from charts/ddpjob-operator/crds/ by `make manifests`; do not edit.\n"


def crd_text() -> str:
    """The CRD exactly as the package ships it."""
    return resources.files(__package__).joinpath("crds", CRD_FILE).read_text()


def chart_crd_text() -> str:
    """What the chart's copy of the CRD must contain."""
    body = "".join(line for line in crd_text().splitlines(keepends=True) if not line.startswith("#"))
    return _CHART_HEADER + body


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
    others = sorted(p for p in CHART_CRDS.glob("*.yaml") if p.name != CRD_FILE)
    bodies = []
    for text in [crd_text(), *(path.read_text() for path in others)]:
        body = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))
        bodies.append(body.strip("\n").removeprefix("---\n") + "\n")
    return _MANIFEST_HEADER + "---\n".join(bodies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write-manifests", action="store_true", help="regenerate manifests/crd.yaml")
    if parser.parse_args().write_manifests:
        if not CHART_CRDS.is_dir():
            parser.error(f"--write-manifests runs in a ddpjob checkout; {CHART_CRDS} does not exist")
        (CHART_CRDS / CRD_FILE).write_text(chart_crd_text())
        MANIFEST_CRD.parent.mkdir(parents=True, exist_ok=True)
        MANIFEST_CRD.write_text(manifest_text())
        for path in (CHART_CRDS / CRD_FILE, MANIFEST_CRD):
            print(f"wrote {path.relative_to(REPO_ROOT)}")
    else:
        print(crd_text(), end="")


if __name__ == "__main__":
    main()
