"""Small promises of the `ddpjob` command line."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_operator import cli
from ddp_operator.runtime import operator_process


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, message, None, None)


@pytest.mark.parametrize(
    ("message", "kept"),
    [
        ("Handler 'on_pod' succeeded.", False),
        ("Timer 'on_timer' succeeded.", False),
        ("creating Job quickstart-2", True),
        ("Handler 'on_pod' failed with an exception. Will retry.", True),
    ],
)
def test_operator_logs_keep_what_changed(message: str, kept: bool) -> None:
    assert operator_process._quiet_successes(_record(message)) is kept


def test_attempt_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["render", "examples/quickstart.yaml", "--attempt", "0"]) == 2
    assert "--attempt: Invalid value: 0: must be ≥ 1" in capsys.readouterr().err


def test_every_command_has_a_description() -> None:
    parser = cli.build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, sub in commands.choices.items():
        assert sub.description, f"`ddpjob {name} --help` has no description"
    assert "kubectl explain" in commands.choices["crd"].format_help()


def test_check_references_names_namespaces_and_defaults_to_none() -> None:
    """The operator looks Secrets and ConfigMaps up only where --check-references says (the chart passes one
    for each of checkReferences.namespaces, where it grants the get): none by default."""
    parser = cli.build_parser()
    assert parser.parse_args(["operator"]).check_references is None
    args = parser.parse_args(["operator", "--check-references=team-a", "--check-references", "team-b"])
    assert args.check_references == ["team-a", "team-b"]


def test_local_fresh_help_says_a_succeeded_run_is_set_aside_not_discarded() -> None:
    """Issue 58: --fresh discards an unfinished run's folder; a Succeeded one goes to <name>.earlier-N."""
    parser = cli.build_parser()
    local = next(
        action.choices["local"]
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    fresh = next(a for a in local._actions if "--fresh" in a.option_strings)
    assert fresh.help is not None
    words = " ".join(fresh.help.split())
    assert "unfinished" in words and "Succeeded" in words and "<name>.earlier-N" in words
    assert "never discarded" in words


class _Stopped(Exception):
    """The test's stop, at the first attempt: what `ddpjob local` said before it is what is checked."""


def test_local_starts_by_repeating_validates_pod_security_warnings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 58 item 9's rest: `ddpjob local --pod-security restricted` says, at its start, what `ddpjob
    validate --pod-security restricted` warns of, in the same words (stopped before any pod starts)."""
    from ddp_operator.local import run as local_run

    job = tmp_path / "job.yaml"
    spec = {"nodes": 2, "device": "cpu", "command": ["torchrun"], "args": ["main.py"]}
    doc = {"apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob", "metadata": {"name": "mingpt"}}
    job.write_text(yaml.safe_dump({**doc, "spec": {**spec, "podTemplate": {"hostNetwork": True}}}))
    (tmp_path / "main.py").write_text("print('train')\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["validate", "--pod-security", "restricted", str(job)]) == 0
    err = capsys.readouterr().err
    warned = [line.split("warning: ", 1)[1] for line in err.splitlines() if "Pod Security" in line]
    assert warned, err

    def stop(*args: Any, **kwargs: Any) -> None:
        raise _Stopped

    monkeypatch.setattr(local_run, "_attempt", stop)
    with pytest.raises(_Stopped):
        cli.main(["local", "--workdir", str(tmp_path / "w"), "--pod-security", "restricted", str(job)])
    out = capsys.readouterr().out
    prefix = "  in a cluster (`ddpjob validate --pod-security restricted` warns): "
    said = [line.removeprefix(prefix) for line in out.splitlines() if line.startswith(prefix)]
    assert said == [
        f"{w} (a namespace enforcing restricted would refuse the pods; here nothing does)" for w in warned
    ]
