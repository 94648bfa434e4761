"""Who wrote a checkpoint and whether this run may load it (:mod:`ddp_trainer.checkpoint.provenance`): pure,
no torch."""

from __future__ import annotations

import dataclasses

import pytest

from ddp_trainer import contract
from ddp_trainer.checkpoint import provenance
from ddp_trainer.checkpoint.provenance import Candidate, Identity, Writer
from ddp_trainer.core.config import TrainerConfig

MINE = Identity("team", "mine", "uid-mine")
OTHER = Identity("team", "other", "uid-other")
CONFIG = TrainerConfig(seed=7, batch_size=16, learning_rate=0.01)
SETTINGS = provenance.settings_of(CONFIG, 4, precision="fp32", optimizer="AdamW")
ME = Writer(MINE, SETTINGS, attempt=2)


def _file(step: int, writer: Writer = ME, payload: bytes = b"torch bytes") -> Candidate:
    header, body = provenance.decode(provenance.encode(writer, step, payload))
    return Candidate(f"step-{step:08d}.pt", step, header, body)


def _corrupt(step: int, why: str = "truncated: 3 of 11 payload bytes") -> Candidate:
    return Candidate(f"step-{step:08d}.pt", step, problem=why)


def test_the_header_round_trips_and_its_digest_covers_header_and_payload() -> None:
    data = provenance.encode(ME, 1500, b"\x00payload\nwith newlines")
    header, payload = provenance.decode(data)
    assert payload == b"\x00payload\nwith newlines"
    assert (header.identity, header.step, header.attempt) == (MINE, 1500, 2)
    assert header.settings == SETTINGS and header.settings_digest == ME.settings_digest
    assert provenance.peek_identity(data[:100] + b"\n") is None  # a cut header line names nobody
    assert provenance.peek_identity(data) == MINE
    for broken, why in [
        (data.replace(b'"mine"', b'"mind"'), "sha256"),  # a flipped bit in the header
        (data[:-1] + bytes([data[-1] ^ 1]), "sha256"),  # ... in the payload
        (data[:-5], "truncated"),
        (data[:40], "no checkpoint header"),
        (b"PK\x03\x04 an old torch.save file", "no checkpoint header"),
        (b'{"format": "ddpjob-checkpoint/1"}\npayload', "unreadable header"),
        (data.replace(b"ddpjob-checkpoint/1", b"ddpjob-checkpoint/9"), "format"),
    ]:
        with pytest.raises(ValueError, match=why):
            provenance.decode(broken)


def test_the_settings_digest_changes_with_every_setting_that_shapes_the_model_but_not_steps() -> None:
    base = provenance.digest(provenance.settings_of(CONFIG, 4, precision="fp32", optimizer="AdamW"))
    assert base == ME.settings_digest == provenance.digest(dict(reversed(SETTINGS.items())))
    same = dataclasses.replace(CONFIG, steps=10_000, sync_every=5, checkpoint_every=50, checkpoint_keep=9)
    assert provenance.digest(provenance.settings_of(same, 4, precision="fp32", optimizer="AdamW")) == base
    changed = [
        dataclasses.replace(CONFIG, **{name: value})
        for name, value in [
            ("model", "pkg:build"),
            ("dataset", "pkg:data"),
            ("seed", 8),
            ("batch_size", 32),
            ("grad_accumulation", 2),
            ("learning_rate", 0.02),
        ]
    ]
    digests = {
        provenance.digest(provenance.settings_of(c, 4, precision="fp32", optimizer="AdamW")) for c in changed
    }
    digests |= {
        provenance.digest(provenance.settings_of(CONFIG, 2, precision="fp32", optimizer="AdamW")),
        provenance.digest(provenance.settings_of(CONFIG, 4, precision="bf16", optimizer="AdamW")),
        provenance.digest(provenance.settings_of(CONFIG, 4, precision="fp32", optimizer="SGD")),
    }
    assert base not in digests and len(digests) == 9


def test_this_jobs_newest_intact_checkpoint_is_resumed_past_corrupt_ones() -> None:
    choice = provenance.choose([_corrupt(30), _file(20), _file(10)], ME)
    assert (choice.action, choice.step, choice.file, choice.payload) == (
        "resume",
        20,
        "step-00000020.pt",
        b"torch bytes",
    )
    assert choice.skipped == ("step-00000030.pt: truncated: 3 of 11 payload bytes",)


def test_a_file_torch_cannot_load_is_skipped_too() -> None:
    def loadable(c: Candidate) -> str:
        return "torch.load failed: UnpicklingError" if c.step == 20 else ""

    choice = provenance.choose([_file(20), _file(10)], ME, loadable=loadable)
    assert (choice.action, choice.step) == ("resume", 10)
    assert choice.skipped == ("step-00000020.pt: torch.load failed: UnpicklingError",)


def test_nothing_or_nothing_intact_is_a_fresh_start() -> None:
    assert provenance.choose([], ME) == provenance.Choice("fresh")
    choice = provenance.choose([_corrupt(20), _corrupt(10, "no header")], ME)
    assert (choice.action, choice.step, len(choice.skipped)) == ("fresh", 0, 2)


def test_another_jobs_checkpoint_is_refused_naming_both_sides() -> None:
    theirs = Writer(OTHER, SETTINGS)
    choice = provenance.choose([_corrupt(1600), _file(1500, theirs)], ME, where="/checkpoints")
    assert (choice.action, choice.reason, choice.payload) == ("refuse", contract.FOREIGN_CHECKPOINT, None)
    assert choice.message == (
        "checkpoint step-00001500.pt in /checkpoints was written by DDPJob team/other (uid uid-other) at "
        "step 1500; this is DDPJob team/mine (uid uid-mine): refusing to resume another job's checkpoint "
        "(set spec.checkpoint.warmStartFrom: other (--warm-start-from=other) to start from its weights, or "
        "give this job its own checkpoint volume)"
    )
    assert choice.skipped == ("step-00001600.pt: truncated: 3 of 11 payload bytes",)


@pytest.mark.parametrize(
    ("theirs", "warm_start_from", "hint"),
    [
        (Identity("team", "mine", "uid-old"), "", "warmStartFrom: mine"),  # deleted and created again
        (Identity("lab", "other", "uid-other"), "other", "warmStartFrom works within one namespace"),
        (OTHER, "third", "warmStartFrom names 'third', which has no intact checkpoint here"),
    ],
)
def test_a_refusal_says_what_would_be_accepted(theirs: Identity, warm_start_from: str, hint: str) -> None:
    choice = provenance.choose([_file(40, Writer(theirs, SETTINGS))], ME, warm_start_from=warm_start_from)
    assert choice.reason == contract.FOREIGN_CHECKPOINT
    assert str(theirs) in choice.message and str(MINE) in choice.message and hint in choice.message


def test_this_jobs_checkpoint_with_other_settings_is_refused_naming_the_setting() -> None:
    other_lr = provenance.settings_of(
        dataclasses.replace(CONFIG, learning_rate=0.02), 2, precision="fp32", optimizer="AdamW"
    )
    choice = provenance.choose([_file(20, Writer(MINE, other_lr)), _file(10)], ME, where="/ckpt")
    assert (choice.action, choice.reason) == ("refuse", contract.SETTINGS_CHANGED)
    assert choice.message.startswith(
        "checkpoint step-00000020.pt in /ckpt was written by this job (DDPJob team/mine (uid uid-mine)) at "
        "step 20 with other settings: learning_rate: 0.02 in the checkpoint, 0.01 now; world_size: 2 in the "
        "checkpoint, 4 now; refusing to resume it"
    )


def test_a_warm_start_takes_the_named_jobs_newest_but_this_jobs_own_checkpoints_win() -> None:
    theirs = Writer(OTHER, {**SETTINGS, "learning_rate": 0.5})  # other settings are fine for weights
    third = Writer(Identity("team", "third", "u3"), SETTINGS)
    choice = provenance.choose(
        [_file(1600, third), _file(1500, theirs), _file(1000, theirs)], ME, warm_start_from="other"
    )
    assert (choice.action, choice.step, choice.warm_from) == ("warm", 1500, "team/other")
    assert choice.skipped == ("step-00001600.pt: written by DDPJob team/third (uid u3)",)
    # Once this job has saved its own, a restart resumes those; the source's files are not "skipped".
    choice = provenance.choose([_file(1500, theirs), _file(20)], ME, warm_start_from="other")
    assert (choice.action, choice.step, choice.warm_from, choice.skipped) == ("resume", 20, "", ())
    # Nothing of the named job's: a fresh start (it "may" seed the weights).
    assert provenance.choose([], ME, warm_start_from="other").action == "fresh"


def test_an_elastic_job_records_its_global_batch_not_its_world_size() -> None:
    """A checkpoint of an elastic job resumes at any world size (its data order is the global batch's),
    never under another maxNodes, and never in a rigid job (or the reverse)."""
    elastic = TrainerConfig(elastic_max_nodes=4)
    at_two = provenance.settings_of(elastic, 2, precision="fp32", optimizer="AdamW")
    at_three = provenance.settings_of(elastic, 3, precision="fp32", optimizer="AdamW")
    assert at_two == at_three and at_two["world_size"] == 0 and at_two["elastic_max_nodes"] == 4
    rigid = provenance.settings_of(TrainerConfig(), 2, precision="fp32", optimizer="AdamW")
    assert provenance.digest(rigid) != provenance.digest(at_two)
    other = provenance.settings_of(TrainerConfig(elastic_max_nodes=8), 2, precision="fp32", optimizer="AdamW")
    assert provenance.digest(other) != provenance.digest(at_two)
