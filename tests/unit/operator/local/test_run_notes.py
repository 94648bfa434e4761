"""What ``ddpjob local`` says at its start (:func:`ddp_operator.local.notes.local_notes`): what `ddpjob
validate` warns of for a cluster, repeated, and where this machine behaves otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddp_operator.api.spec import parse
from ddp_operator.api.spec_warnings import warnings
from ddp_operator.local.notes import local_notes
from ddp_trainer import contract

DOC: dict[str, Any] = {
    "apiVersion": "ddpjob.io/v1alpha1",
    "kind": "DDPJob",
    "metadata": {"name": "mingpt"},
    "spec": {"nodes": 2, "device": "cpu", "command": ["torchrun"], "args": ["main.py"]},
}


def test_checkpoints_on_a_pod_local_emptydir_are_said_as_validate_says_them_and_why_here_differs() -> None:
    spec = parse(DOC)  # maxRestarts 3 by default, no spec.checkpoint
    notes = local_notes(spec, contract.FIRST_ATTEMPT, Path("/r"))
    said = [note for note in notes if note.startswith("in a cluster (`ddpjob validate` warns): ")]
    assert said == [
        "in a cluster (`ddpjob validate` warns): spec.checkpoint: checkpoints go to a pod-local emptyDir, so "
        "the 3 gang restart(s) of spec.maxRestarts will start from step 0; give "
        "spec.checkpoint.volumeClaimTemplate (the operator creates a PersistentVolumeClaim), "
        "spec.checkpoint.volume or spec.checkpoint.s3 (here the pods share one folder, so a restart resumes "
        "all the same: a cluster would not)"
    ]


def test_every_warning_of_validate_is_repeated_once() -> None:
    """A spec with two of them: spec.trainer beside a command, and a claim a default cluster cannot give
    (ReadWriteMany from the default class); a claim outlives pods, so no emptyDir warning. A job with no
    restarts loses nothing on an emptyDir: nothing said."""
    doc = {
        **DOC,
        "spec": {
            **DOC["spec"],
            "trainer": {"steps": 10},
            "checkpoint": {"volumeClaimTemplate": {"size": "1Gi", "accessModes": ["ReadWriteMany"]}},
        },
    }
    spec = parse(doc)
    expected = warnings(spec)
    assert len(expected) == 2, expected
    notes = local_notes(spec, contract.FIRST_ATTEMPT, Path("/r"))
    assert [n for n in notes if n.startswith("in a cluster")] == [
        f"in a cluster (`ddpjob validate` warns): {w}" for w in expected
    ]
    no_restarts = parse({**DOC, "spec": {**DOC["spec"], "maxRestarts": 0}})
    assert not [n for n in local_notes(no_restarts, 1, Path("/r")) if n.startswith("in a cluster")]


def test_what_validate_warns_of_for_a_pod_security_level_is_repeated_at_the_start_in_its_words() -> None:
    """Issue 58 item 9's rest: `ddpjob local --pod-security LEVEL` says what `ddpjob validate --pod-security
    LEVEL` warns of (one definition, local.validation), each once; without a level, nothing of it (as
    validate); a job that breaks nothing says nothing."""
    from ddp_operator.local import validation

    doc = {**DOC, "spec": {**DOC["spec"], "podTemplate": {"hostNetwork": True}}}
    spec = parse(doc)
    expected = validation.pod_security(spec, "restricted")
    assert expected and any("spec.podTemplate.hostNetwork" in w for w in expected), expected
    notes = local_notes(spec, contract.FIRST_ATTEMPT, Path("/r"), "restricted")
    said = [n for n in notes if n.startswith("in a cluster (`ddpjob validate --pod-security restricted`")]
    assert said == [
        f"in a cluster (`ddpjob validate --pod-security restricted` warns): {w} (a namespace enforcing "
        "restricted would refuse the pods; here nothing does)"
        for w in expected
    ]
    assert not [n for n in local_notes(spec, 1, Path("/r")) if "--pod-security" in n]
    quiet = parse(DOC)
    assert not [n for n in local_notes(quiet, 1, Path("/r"), "restricted") if "--pod-security" in n]
