"""A plain wheel (`pip install .`, not editable) works outside the checkout: the CRD ships as package data."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_wheel_installed_elsewhere_runs_crd_and_validate(tmp_path: Path) -> None:
    wheels, site, work = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere"
    work.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(REPO)], check=True, timeout=600)
    (wheel,) = wheels.glob("ddpjob-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, timeout=300)
    (work / "job.yaml").write_text((REPO / "examples" / "quickstart.yaml").read_text())
    (work / "bad.yaml").write_text(
        (REPO / "examples" / "quickstart.yaml").read_text().replace("nodes: 2", "nodes: 0")
    )
    env = {**os.environ, "PYTHONPATH": str(site)}  # ahead of the checkout's editable install

    def ddpjob(*args: str) -> subprocess.CompletedProcess[str]:
        code = (
            "import sys, ddp_operator; from ddp_operator.cli import main; "
            "print(ddp_operator.__file__, file=sys.stderr); sys.exit(main(sys.argv[1:]))"
        )
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    crd = ddpjob("crd")
    assert crd.returncode == 0, crd.stderr
    assert crd.stderr.strip().startswith(str(site)), f"imported from the checkout: {crd.stderr}"
    assert crd.stdout == (REPO / "operator" / "ddp_operator" / "crds" / "ddpjobs.ddpjob.io.yaml").read_text()
    good, bad = ddpjob("validate", "job.yaml"), ddpjob("validate", "bad.yaml")
    assert good.returncode == 0, good.stdout + good.stderr
    assert bad.returncode != 0 and "spec.nodes" in bad.stdout + bad.stderr


def test_every_package_folder_is_listed_for_the_wheel() -> None:
    """``[tool.setuptools] packages`` names packages one by one: a subpackage left out is missing from the
    wheel (and the image), while the editable install of the checkout still finds it."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    roots = project["tool"]["setuptools"]["package-dir"]
    found = {
        ".".join((name, *init.parent.relative_to(REPO / root).parts))
        for name, root in roots.items()
        for init in (REPO / root).rglob("__init__.py")
    }
    assert found == set(project["tool"]["setuptools"]["packages"])
