"""The torch that tests/contract/test_torch_private.py checked, pinned in one place: the ``trainer`` extra of
``pyproject.toml``. The venv installs that extra (``make tools``), and the trainer image installs the wheel
with it (the Dockerfile's ``pip install "/wheels/ddpjob-….whl[trainer,s3]"``), so both get the range of that
one line. These fail if the torch the contract ran on is outside the pin, if the pin admits a minor it was
not run on, or if the image's install would resolve torch from anything but that line.
docs/operator.md, "Moving the torch pin", says how to move it."""

from __future__ import annotations

import email.parser
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]


def _pin() -> SpecifierSet:
    """pyproject.toml's torch requirement, in the ``trainer`` extra and nowhere else: the one definition."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    groups = {"dependencies": project["dependencies"], **project["optional-dependencies"]}
    found = {
        group: Requirement(line)
        for group, lines in groups.items()
        for line in lines
        if Requirement(line).name == "torch"
    }
    assert list(found) == ["trainer"], f"pyproject.toml requires torch in {list(found)}, not once in trainer"
    return found["trainer"].specifier


def test_the_torch_the_contract_ran_on_is_the_pinned_minor() -> None:
    pin = _pin()
    try:
        installed = Version(version("torch"))
    except PackageNotFoundError:
        raise AssertionError("torch is not installed: `make tools` installs the trainer extra") from None
    assert pin.contains(installed, prereleases=True), (
        f"the venv's torch {installed} is outside pyproject.toml's pin torch{pin}: the private-parts "
        "contract (tests/contract/test_torch_private.py) says nothing of it; reinstall (`make tools`) or "
        "move the pin (docs/operator.md, 'Moving the torch pin')"
    )
    major, minor = installed.major, installed.minor
    below = Version(f"{major}.{minor - 1}.999") if minor else Version(f"{major - 1}.999")
    above = Version(f"{major}.{minor + 1}")
    for outside in (below, above):
        assert not pin.contains(outside, prereleases=True), (
            f"the pin torch{pin} admits torch {outside}, which the private-parts contract was not run on "
            f"(ran on {installed}): pin torch>={major}.{minor},<{above}"
        )


def _build_stage_inputs(into: Path) -> Path:
    """The files the Dockerfile's build stage copies before it builds the wheel, laid out as it does."""
    text = (REPO / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    (build,) = [stage for stage in stages if stage.split("\n")[0].split()[-1] == "build"]
    copies = [shlex.split(line)[1:] for line in build.splitlines() if line.startswith("COPY ")]
    assert copies and all(not words[0].startswith("--") for words in copies), copies
    for *sources, dest in copies:
        for source in sources:
            origin, target = REPO / source, into / dest
            if origin.is_dir():
                shutil.copytree(
                    origin, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
                )
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, target / origin.name)
    return into


_METADATA = """
import importlib, json, sys
paths, name, out = sys.argv[1:]
sys.path[:0] = json.loads(paths)
print(importlib.import_module(name).prepare_metadata_for_build_wheel(out))
"""


def test_the_image_installs_torch_from_the_pin_of_pyproject(tmp_path: Path) -> None:
    """The round trip of the one definition: the wheel the Dockerfile builds carries pyproject.toml's pin
    under its ``trainer`` extra, the trainer image installs that extra, and nothing the image build runs
    names torch by itself."""
    import json

    source = _build_stage_inputs(tmp_path / "src")
    system = tomllib.loads((source / "pyproject.toml").read_text())["build-system"]
    paths = [str(source / p) for p in system.get("backend-path", [])]
    out = tmp_path / "metadata"
    out.mkdir()
    built = subprocess.run(
        [sys.executable, "-c", _METADATA, json.dumps(paths), system["build-backend"], str(out)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    info = out / built.stdout.strip().splitlines()[-1] / "METADATA"
    requires = email.parser.Parser().parsestr(info.read_text()).get_all("Requires-Dist") or []
    torch = [Requirement(line) for line in requires if Requirement(line).name == "torch"]
    assert len(torch) == 1 and torch[0].marker is not None, f"the wheel requires torch as {torch}"
    assert torch[0].marker.evaluate({"extra": "trainer"}), (
        f"the wheel's torch is not the trainer extra's: {torch}"
    )
    assert torch[0].specifier == _pin(), (
        f"the wheel the image installs asks torch{torch[0].specifier}, pyproject.toml's pin is torch{_pin()}"
    )

    dockerfile = (REPO / "Dockerfile").read_text()
    trainer = re.split(r"^FROM ", dockerfile, flags=re.M)[-1]
    assert re.search(r'pip install [^\n]*\.whl\[[\w,]*\btrainer\b[\w,]*\]"', trainer), (
        "the trainer image no longer installs the wheel's trainer extra (the pinned torch)"
    )
    for path in [REPO / "Dockerfile", *sorted((REPO / "hack" / "images").glob("*.sh")), REPO / "Makefile"]:
        for line in path.read_text().splitlines():
            if re.search(r"\bpip3?\b.*\binstall\b", line) and not line.lstrip().startswith("#"):
                assert not re.search(r"(^|[\s\"'])torch\b", line), (
                    f"{path.relative_to(REPO)} installs torch by name, beside pyproject.toml's pin: {line}"
                )
