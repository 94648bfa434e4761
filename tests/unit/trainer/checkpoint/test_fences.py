"""The fence in a checkpoint's publication (:mod:`ddp_trainer.checkpoint.fences`): a world that went on
records where it started, and an older world's checkpoint published after that, at a later step, is never
restored, never replaces nor prunes a newer world's file. The pure rule first, then the real stores (a
folder and MinIO), with the stale world's late write made exactly as a frozen node that wakes makes it:
after its own check, straight into the store."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from ddp_trainer.checkpoint import checkpoints, fences, payload, provenance
from ddp_trainer.checkpoint.fences import Fence
from ddp_trainer.checkpoint.objectstore import S3Store
from ddp_trainer.checkpoint.provenance import Candidate, Identity, Writer
from ddp_trainer.checkpoint.stores import Store
from helpers.s3server import S3Server
from helpers.trained import ME, OTHER, trained_state

MINE = ME.identity


def _fence(world: int, step: int, who: Identity = MINE) -> Fence:
    return Fence(who, world, step)


def test_a_checkpoint_is_stale_only_when_a_later_world_started_from_an_earlier_step() -> None:
    known = [_fence(1, 0), _fence(2, 20), _fence(3, 40)]
    assert fences.stale(MINE, 1, 20, known) is None  # where world 2 started: the world really reached it
    assert fences.stale(MINE, 1, 30, known) == _fence(2, 20)  # past it: published after world 2 began
    assert fences.stale(MINE, 2, 50, known) == _fence(3, 40)
    assert fences.stale(MINE, 3, 90, known) is None  # the newest world is never stale
    assert fences.stale(MINE, 0, 20, known) == _fence(1, 0)  # no world (before fences): the oldest
    upgraded = [_fence(1, 20)]  # the first world with fences resumed step 20 of an older trainer's
    assert fences.stale(MINE, 0, 20, upgraded) is None and fences.stale(MINE, 0, 30, upgraded) == upgraded[0]
    assert fences.stale(OTHER.identity, 1, 30, known) is None  # another job's fences rule nothing of mine


def test_a_fence_carries_only_the_earlier_fences_that_still_rule_something_out() -> None:
    said = [
        _fence(1, 0),
        _fence(2, 20),
        _fence(3, 10),
        _fence(4, 30),
        _fence(4, 25),
        _fence(2, 5, OTHER.identity),
    ]
    # world 2 (from 20) rules out nothing world 3 (from 10) does not; world 4 said twice: the stricter
    assert fences.carried(said, MINE) == [_fence(1, 0), _fence(3, 10), _fence(4, 25)]
    new = _fence(5, 40)
    assert fences.decode(fences.encode(new, fences.carried(said, MINE))) == [new, *fences.carried(said, MINE)]
    for broken in [
        b"",
        b"{}",
        b'{"format": "ddpjob-fence/9"}',
        b'{"format": "ddpjob-fence/1", "job": 1}',
        b"[",
    ]:
        with pytest.raises(ValueError):
            fences.decode(broken)


def test_worlds_are_numbered_by_the_fences_of_the_jobs_name_in_the_store() -> None:
    names = ["fence-00000002.mine.json", "fence-00000007.other.json", "step-00000010.mine.pt", "fence-x.json"]
    assert fences.listed(names, "mine") == [(2, "fence-00000002.mine.json")]
    assert fences.next_world(names, "mine") == 3
    assert fences.next_world(names, "new") == 1
    assert (
        fences.fence_name(3, "mine") == "fence-00000003.mine.json"
        and fences.fence_name(1) == "fence-00000001.json"
    )
    # from world 2 on, the world is in the checkpoint's name: two worlds never write the same file
    assert checkpoints.checkpoint_name(30, "mine", 1) == "step-00000030.mine.pt"
    assert checkpoints.checkpoint_name(30, "mine", 12) == "step-00000030.mine.w12.pt"


def _file(step: int, writer: Writer, world: int) -> Candidate:
    header, body = provenance.decode(provenance.encode(dataclasses.replace(writer, world=world), step, b"x"))
    return Candidate(checkpoints.checkpoint_name(step, writer.identity.name, world), step, header, body)


def test_the_restore_passes_over_a_stale_worlds_late_checkpoint_and_says_so() -> None:
    known = [_fence(1, 0), _fence(2, 20)]
    stale = fences.staleness(known)
    found = [_file(40, ME, 1), _file(30, ME, 2), _file(30, ME, 1), _file(20, ME, 1)]
    choice = provenance.choose(found, ME, stale=stale)
    assert (choice.action, choice.file) == ("resume", "step-00000030.mine.w2.pt")
    assert choice.skipped == (
        "step-00000040.mine.pt: written by world 1 after world 2 started from step 20 (a stale world's late "
        "checkpoint: the job went on without it)",
    )
    # with nothing of world 2 yet, world 2's own start point, never the late one
    assert provenance.choose([_file(30, ME, 1), _file(20, ME, 1)], ME, stale=stale).step == 20
    # a checkpoint from before fences existed (no world) still restores
    legacy = provenance.choose([_file(20, ME, 0)], ME, stale=fences.staleness([_fence(1, 20)]))
    assert (legacy.action, legacy.step) == ("resume", 20)


@pytest.fixture(params=["folder", "minio"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "folder":
        return checkpoints.open_store(tmp_path / "ckpt")
    server: S3Server = request.getfixturevalue("s3_server")
    return S3Store.from_url(f"s3://{server.bucket()}/team/run", server.env())


def _world(store: Store, writer: Writer = ME) -> tuple[Writer, provenance.Choice]:
    """A new world's restore, as the trainer's rank 0 does it (it records the world's fence)."""
    choice = checkpoints.choose_on_rank0(store, writer, "")
    return dataclasses.replace(writer, world=choice.world), choice


def _save(store: Store, writer: Writer, step: int, keep: int = 2) -> str | None:
    return checkpoints.save(store, trained_state(step=step), writer, keep)


def _late(store: Store, writer: Writer, step: int) -> str:
    """The stale world's late write: its check passed before its node froze; it publishes on waking."""
    name = checkpoints.checkpoint_name(step, writer.identity.name, writer.world)
    store.publish(name, provenance.encode(writer, step, payload.serialize(trained_state(step=step))))
    return name


def _steps(store: Store) -> list[str]:
    return [name for _, name in checkpoints.list_checkpoints(store)]


def test_an_older_worlds_checkpoint_published_after_a_newer_worlds_fence_is_never_restored(
    store: Store,
) -> None:
    first, choice = _world(store)
    assert (choice.action, first.world) == ("fresh", 1)
    assert _save(store, first, 10) and _save(store, first, 20)
    second, choice = _world(store)  # the node that held rank 0 froze; the others went on from step 20
    assert (choice.action, choice.step, second.world) == ("resume", 20, 2)
    assert _save(store, first, 30) is None  # a stale writer that can still check does not publish
    late = _late(store, first, 30)  # ... one that checked before it froze publishes when it wakes
    # ... and prunes, keeping 1: world 2's start point (world 1's step 20) stays, the late file goes next
    assert checkpoints.prune(store, MINE, 30, 1, world=1, saved=late) == []
    _late(store, first, 40)
    third, choice = _world(store)  # world 2 is lost before its first save: world 3 restores
    assert (choice.action, choice.step, choice.file, third.world) == (
        "resume",
        20,
        "step-00000020.mine.pt",
        3,
    )
    assert [s.split(":")[0] for s in choice.skipped] == ["step-00000040.mine.pt", "step-00000030.mine.pt"]
    assert all("stale world" in s for s in choice.skipped)
    assert _save(store, third, 30) == store.location("step-00000030.mine.w3.pt")
    assert _steps(store) == ["step-00000020.mine.pt", "step-00000030.mine.w3.pt"]  # the stale ones removed


def test_a_stale_world_never_replaces_nor_prunes_a_newer_worlds_checkpoint(store: Store) -> None:
    first, _ = _world(store)
    assert _save(store, first, 10) and _save(store, first, 20)
    second, _ = _world(store)
    assert _save(store, second, 30, keep=3) and _save(store, second, 40, keep=3)
    newer = {name: store.read(name) for name in _steps(store) if ".w2." in name}
    earlier = _late(store, first, 30)
    late = _late(store, first, 40)  # the same step as world 2's newest: another name
    assert checkpoints.prune(store, MINE, 40, 1, world=1, saved=late) == [earlier]  # only what is stale
    assert "step-00000020.mine.pt" in _steps(store)  # where world 2 started: kept, whatever keep says
    assert {name: store.read(name) for name in _steps(store) if ".w2." in name} == newer  # untouched
    third, choice = _world(store)
    assert (choice.step, choice.file, third.world) == (40, "step-00000040.mine.w2.pt", 3)
    assert choice.skipped == ()  # world 2's file of step 40 is the newest: the late one is never read
    assert checkpoints.list_checkpoints(store)[-2:] == [(40, late), (40, "step-00000040.mine.w2.pt")]


def test_a_fence_is_kept_in_few_objects_and_another_jobs_are_left_alone(store: Store) -> None:
    other, _ = _world(store, OTHER)
    for _ in range(7):
        _world(store)
    fence_objects = sorted(n for n in store.names() if n.startswith("fence-"))
    assert fence_objects == [
        "fence-00000001.other.json",
        *(fences.fence_name(w, "mine") for w in range(4, 8)),
    ], fence_objects  # keep 4 of mine: the newest carries what the others said
    assert other.world == 1
    read: Any = checkpoints.read_fences(store, MINE)
    assert max(f.world for f in read) == 7 and all(f.identity == MINE for f in read)
