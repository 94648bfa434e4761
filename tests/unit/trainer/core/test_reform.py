"""The rank plan of a re-formed world, and the optimizer state's layout as :func:`copy_state_` sends it
(the multi-process heal itself: tests/integration/trainer/test_reform_multiprocess.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ddp_trainer.core import reform
from ddp_trainer.core.reform import World, joiner_world, survivor_world


def test_survivors_keep_their_order_and_joiners_come_after() -> None:
    assert [survivor_world(r, 4, {1}, 0, "w1") for r in (0, 2, 3)] == [
        World(0, 3, "w1"),
        World(1, 3, "w1"),
        World(2, 3, "w1"),
    ]
    assert survivor_world(2, 3, {0}, 2, "w2") == World(1, 4, "w2")
    assert [joiner_world(i, 2, 2, "w2") for i in (0, 1)] == [World(2, 4, "w2"), World(3, 4, "w2")]


@pytest.mark.parametrize(
    ("rank", "size", "lost", "joiners"), [(1, 3, {1}, 0), (3, 3, set(), 0), (0, 3, {5}, 0), (0, 3, set(), -1)]
)
def test_a_survivor_plan_that_cannot_be_is_refused(
    rank: int, size: int, lost: set[int], joiners: int
) -> None:
    with pytest.raises(ValueError):
        survivor_world(rank, size, lost, joiners, "w")


def test_a_joiner_out_of_its_count_is_refused() -> None:
    with pytest.raises(ValueError):
        joiner_world(2, 2, 2, "w")


def test_the_optimizer_layout_sends_large_tensors_and_carries_small_ones() -> None:
    module = nn.Linear(100, 2)
    optimizer = torch.optim.AdamW(module.parameters())
    module(torch.ones(1, 100)).sum().backward()
    optimizer.step()
    state = optimizer.state_dict()
    sent: list[torch.Tensor] = []
    skeleton = reform._strip(state, sent)
    assert [tuple(t.shape) for t in sent] == [(2, 100), (2, 100)]  # the weight's exp_avg, exp_avg_sq
    assert len(list(reform._slots(skeleton))) == 2
    rebuilt = reform._fill(skeleton, iter([t.clone() for t in sent]))
    fresh = torch.optim.AdamW(nn.Linear(100, 2).parameters())
    fresh.load_state_dict(rebuilt)
    for p, q in zip(state["state"].values(), fresh.state_dict()["state"].values(), strict=True):
        assert all(torch.equal(p[k], q[k]) and p[k].dtype == q[k].dtype for k in p)


def test_a_re_formed_group_waits_only_as_long_as_asked() -> None:
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)  # type: ignore[attr-defined]
    with pytest.raises(dist.DistStoreError):
        reform.reform(store, World(0, 2, "alone"), timeout=timedelta(seconds=0.5))
    assert not dist.is_initialized()


def test_a_world_of_one_re_forms_in_place_and_copies_from_itself() -> None:
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)  # type: ignore[attr-defined]
    try:
        for generation in range(2):
            reform.reform(store, World(0, 1, f"w{generation}"), timeout=timedelta(seconds=10))
            module = nn.Linear(3, 3)
            before = module.weight.detach().clone()
            copied = reform.copy_state_(module, torch.optim.SGD(module.parameters()))
            assert torch.equal(module.weight, before) and copied.tensors == 2
    finally:
        reform.abandon_group()


def test_copy_state_carries_the_sources_extra() -> None:
    store = reform.bootstrap_store("127.0.0.1", 0, 0, 1, timedelta(seconds=10))
    try:
        reform.reform(store, World(0, 1, reform.DEFAULT_PREFIX), timeout=timedelta(seconds=10))
        module = nn.Linear(3, 3)
        copied = reform.copy_state_(module, None, extra={"step": 7, "scaler": {"scale": 2.0}})
        assert copied.extra == {"step": 7, "scaler": {"scale": 2.0}}
    finally:
        reform.abandon_group()


def test_a_rank_that_reads_the_notice_before_rank_0_connects_once_rank_0s_store_listens() -> None:
    """bootstrap_store: a rank other than 0 waits until the new world's store listens (torch's own client
    would back off for 0.6 s when it comes early), bounded by its timeout."""
    import socket
    import threading

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert not reform.listening("127.0.0.1", port, 0.05)  # no one listens: False at the deadline
    got: dict[str, object] = {}

    def early() -> None:
        got["client"] = reform.bootstrap_store("127.0.0.1", port, 1, 2, timedelta(seconds=10))

    client = threading.Thread(target=early)
    client.start()
    master = reform.bootstrap_store("127.0.0.1", port, 0, 2, timedelta(seconds=10))  # waits for rank 1
    client.join(timeout=10)
    master.set("k", "v")
    assert got["client"].get("k") == b"v"  # type: ignore[attr-defined]


def _gloo(message: str) -> RuntimeError:
    return RuntimeError(f"[gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:1: {message}")


@pytest.mark.parametrize(
    "error",
    [
        _gloo("Connection reset by peer. This is typically caused by a remote worker hanging"),
        _gloo("Connection closed by peer [127.0.0.1]:2"),
        _gloo("Broken pipe"),
        dist.DistNetworkError("connect() timed out"),
    ],
)
def test_a_gone_peer_is_a_peer_loss(error: BaseException) -> None:
    assert reform.is_peer_loss(error)


def test_a_peer_loss_is_found_under_the_error_raised_from_it() -> None:
    try:
        try:
            raise _gloo("Connection reset by peer")
        except RuntimeError:
            raise ValueError("the sync check was not joined by the other ranks") from None
    except ValueError as wrapped:
        assert reform.is_peer_loss(wrapped)


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("[pair.cc:598] Timed out waiting 1800000ms for recv operation to complete"),
        ValueError("Connection reset by peer"),  # not from a collective
        dist.DistStoreError("wait timeout after 30000ms"),
        KeyboardInterrupt(),
    ],
)
def test_other_errors_are_not(error: BaseException) -> None:
    assert not reform.is_peer_loss(error)


def _arrive(*entries: tuple[str, int]) -> list[reform.Arrival]:
    return [reform.Arrival(role, step, "L") for role, step in entries]


def test_survivors_at_one_step_resume_there_and_send_nothing() -> None:
    plan = reform.resume_plan(_arrive(("survivor", 10), ("survivor", 10)))
    assert plan == reform.Plan(10, src=0, receivers=(), lost=0)
    dropped = [reform.Arrival("survivor", 10, "L", dropped=True), reform.Arrival("survivor", 10, "L")]
    assert reform.resume_plan(dropped).lost == 1


def test_the_lowest_survivor_at_the_lowest_step_sends_to_fresh_ranks_and_those_further() -> None:
    plan = reform.resume_plan(_arrive(("fresh", 0), ("survivor", 11), ("survivor", 10), ("survivor", 10)))
    assert (plan.step, plan.src, plan.receivers, plan.lost) == (10, 2, (0, 1), 1)


def test_a_survivor_a_step_further_that_dropped_the_next_loses_the_world_one_step() -> None:
    """Rank 1 completed step 11 (the lost peer's all-reduce half done: rank 2's never ended) and dropped step
    12; rank 2 dropped step 11. The world trains step 11 again, once: one step lost, not two."""
    further = reform.Arrival("survivor", 11, "L", dropped=True)
    plan = reform.resume_plan(
        [reform.Arrival("fresh", 0, "L"), further, reform.Arrival("survivor", 10, "L", dropped=True)]
    )
    assert (plan.step, plan.src, plan.receivers, plan.lost) == (10, 2, (0, 1), 1)


def test_no_survivor_starts_as_before_heals() -> None:
    assert reform.resume_plan(_arrive(("fresh", 0), ("fresh", 0))) == reform.Plan(None)


def test_a_plan_is_refused_for_survivors_apart_or_layouts_that_differ() -> None:
    assert "apart" in reform.resume_plan(_arrive(("survivor", 10), ("survivor", 12))).refused
    mixed = [reform.Arrival("survivor", 1, "L"), reform.Arrival("fresh", 0, "M")]
    assert "[1]" in reform.resume_plan(mixed).refused


def test_the_layout_digest_tells_modules_apart() -> None:
    assert reform.layout_digest(nn.Linear(3, 3)) == reform.layout_digest(nn.Linear(3, 3))
    assert reform.layout_digest(nn.Linear(3, 3)) != reform.layout_digest(nn.Linear(3, 4))
