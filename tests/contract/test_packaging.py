"""Packaging: a plain wheel (`pip install .`, not editable) works outside the checkout (the CRD ships as
package data), and building either kind of wheel, as `pip install .` and `pip install -e .` do, prints no
warning and leaves out no package, data-only ones included."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE_ROOTS = {"ddp_operator": REPO / "operator", "ddp_trainer": REPO / "trainer_image"}

# What pip runs in its build subprocess (pyproject_hooks' _in_process): the project's backend, imported from
# backend-path while warnings are recorded, and its hooks; pip prints every UserWarning recorded, even at -q.
_BUILD = """
import importlib, json, sys, warnings
paths, name, out, count = sys.argv[1:]  # read first: setuptools' hooks rewrite sys.argv
sys.path[:0] = json.loads(paths)
with warnings.catch_warnings(record=True) as said:
    backend = importlib.import_module(name)
    hooks = [backend.build_wheel, backend.build_editable, backend.build_sdist][: int(count)]
    built = [hook(out) for hook in hooks]
shown = [f"{w.category.__name__}: {w.message}" for w in said if issubclass(w.category, UserWarning)]
print(json.dumps({"built": built, "warnings": shown}))
"""


def _shipped_files() -> set[str]:
    """Every file a wheel must carry: modules, py.typed markers and data, in every (sub)package."""
    found = set()
    for package, root in PACKAGE_ROOTS.items():
        for path in (root / package).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                found.add(path.relative_to(root).as_posix())
    return found


def _build(source: Path, out: Path, hooks: int) -> list[str]:
    """The first ``hooks`` of build_wheel, build_editable and build_sdist run on ``source``, as pip runs
    them; what they built. Fails on any warning they record."""
    system = tomllib.loads((source / "pyproject.toml").read_text())["build-system"]
    paths = [str(source / p) for p in system.get("backend-path", [])]
    built = subprocess.run(
        [sys.executable, "-c", _BUILD, json.dumps(paths), system["build-backend"], str(out), str(hooks)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    result = json.loads(built.stdout.splitlines()[-1])
    assert result["warnings"] == [], "\n\n".join(result["warnings"])
    names: list[str] = result["built"]
    return names


def _fresh_checkout(into: Path) -> Path:
    """The checkout's files (tracked, or new and not ignored) without its build leftovers: a stale
    ``*.egg-info`` manifest would put in the sdist what a fresh checkout's leaves out."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, into / name)
    return into


@pytest.mark.slow
def test_building_the_wheels_prints_no_warning_and_ships_every_package(tmp_path: Path) -> None:
    source = _fresh_checkout(tmp_path / "checkout")
    wheel, editable, sdist = _build(source, tmp_path, 3)
    names = set(zipfile.ZipFile(tmp_path / wheel).namelist())
    expected = _shipped_files()
    assert {"ddp_operator/api/crds/ddpjobs.ddpjob.io.yaml", "ddp_trainer/py.typed"} <= expected
    assert expected - names == set(), "left out of the wheel"
    assert "editable" in editable and (tmp_path / editable).is_file()
    with tarfile.open(tmp_path / sdist) as archive:  # a wheel builds from the sdist too (python -m build)
        archive.extractall(tmp_path / "sdist", filter="data")
    (unpacked,) = (tmp_path / "sdist").iterdir()
    (again,) = _build(unpacked, tmp_path / "again", 1)
    assert expected - set(zipfile.ZipFile(tmp_path / "again" / again).namelist()) == set()


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
    packaged = REPO / "operator" / "ddp_operator" / "api" / "crds" / "ddpjobs.ddpjob.io.yaml"
    assert crd.stdout == packaged.read_text()
    good, bad = ddpjob("validate", "job.yaml"), ddpjob("validate", "bad.yaml")
    assert good.returncode == 0, good.stdout + good.stderr
    assert bad.returncode != 0 and "spec.nodes" in bad.stdout + bad.stderr
