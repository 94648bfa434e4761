"""A silent peer, judged from the rendezvous' keep-alives (launch/silence.py): a member that stops renewing
for the bound is silent; one that left with a fresh keep-alive left on purpose; an agent dropped from its
round knows it; an agent that stalled itself judges nobody; a slow rank whose agent renews is never silent;
the mark another agent left is followed; and the silent stop is a resize in the book, never a restart."""

from __future__ import annotations

from pathlib import Path

from ddp_trainer import contract
from ddp_trainer.core import inplace
from ddp_trainer.launch import silence
from ddp_trainer.launch.book import Book

A, B, C = "a", "b", "c"
BOUND = 5.0


def _watch(now: float = 0.0) -> silence.Watch:
    watch = silence.Watch(bound=BOUND)
    watch.begin(7, A, [A, B, C], {A: 1, B: 1, C: 1}, now)
    return watch


def _run(watch: silence.Watch, beats_at: dict[float, dict[str, int]], until: float, **kw: object) -> list:
    """Poll every 0.5 s up to ``until`` with the keep-alives ``beats_at`` gives from each time on; the
    verdicts in order (with their time)."""
    beats, found, now = {A: 1, B: 1, C: 1}, [], 0.0
    participants = kw.get("participants", [A, B, C])
    while now <= until:
        beats = beats_at.get(now, beats)
        if (verdict := watch.observe(7, participants, beats, None, now)) is not None:
            found.append((now, verdict))
        now += silence.POLL_SECONDS
    return found


def _renewing(until: float, *nodes: str, every: float = 2.0) -> dict[float, dict[str, int]]:
    """Keep-alives of ``nodes`` renewed every ``every`` seconds (the others' frozen at 1)."""
    out, n, t = {}, 1, 0.0
    while t <= until:
        out[t] = {A: n, B: 1, C: 1, **{node: n for node in nodes}}
        n, t = n + 1, t + every
    return out


def test_a_member_that_stops_renewing_is_silent_after_the_bound_and_not_before() -> None:
    found = _run(_watch(), _renewing(20, A, B), until=20)  # c never renews again
    assert found, "a frozen member was never judged silent"
    at, verdict = found[0]
    assert verdict.kind == silence.SILENT and verdict.nodes == ("c",) and verdict.judged_here
    assert BOUND + silence.MARGIN_SECONDS <= at <= BOUND + silence.MARGIN_SECONDS + 1, at
    assert "went silent: no keep-alive for" in verdict.cause()


def test_members_renewing_every_two_seconds_are_never_silent() -> None:
    # a rank ten times slower, or rank 0 writing a checkpoint for a minute: its agent renews as usual
    assert _run(_watch(), _renewing(120, A, B, C), until=120) == []


def test_a_member_that_left_with_a_fresh_keep_alive_left_on_purpose() -> None:
    watch = _watch()
    assert watch.observe(7, [A, B, C], {A: 2, B: 2, C: 2}, None, 1.0) is None
    # c's agent stopped its workers for a grow and left the round (torch removes its keep-alive too)
    now = 1.5
    while now < 30:
        assert watch.observe(7, [A, B], {A: int(now), B: int(now)}, None, now) is None, now
        now += silence.POLL_SECONDS
    assert C not in watch.members


def _leaves(watch: silence.Watch, at: float) -> silence.Verdict | None:
    """``watch`` (a's, of round 3 with b) polled every 0.5 s while b's keep-alive stays as it began, then b
    gone from the state at ``at``: the verdict then."""
    watch.begin(3, A, [A, B], {A: 1, B: 1}, 0.0)
    now = silence.POLL_SECONDS
    while now < at:
        assert watch.observe(3, [A, B], {A: 1, B: 1}, None, now) is None, now
        now += silence.POLL_SECONDS
    return watch.observe(3, [A], {A: 2}, None, at)


def test_a_rigid_member_whose_rank_failed_leaves_on_purpose_between_its_five_second_renewals() -> None:
    # the CI failure of 2026-12-05 (test_kueue's restart in place): rank 1 killed while rank 0 wrote its
    # checkpoint; node 1's agent left the round at once to restart its gang, its last renewal 4.6 s old on a
    # rigid job's 5 s keep-alive, and node 0 took it for silent: the pod failed, no restart in place
    rigid = silence.Watch(bound=15.0, interval=5.0)
    assert _leaves(rigid, 5.0) is None
    assert B not in rigid.members and B in rigid.left
    # the same gap on an elastic job's 1 s keep-alive: a member that had gone silent before it left
    late = _leaves(silence.Watch(bound=BOUND), 5.0)
    assert late is not None and late.kind == silence.SILENT and late.nodes == (B,), late
    # a rigid member gone after more than two intervals without a renewal had gone silent
    gone = _leaves(silence.Watch(bound=15.0, interval=5.0), 11.5)
    assert gone is not None and gone.kind == silence.SILENT and gone.nodes == (B,), gone


def test_the_rounds_host_gone_while_this_nodes_workers_still_run_is_lost_after_the_bound() -> None:
    # the real-node e2e's hang (issue 54): the grown world's rank-0 node lost as its workers started; the
    # store's process watch dropped its agent at once, so it left the state with a fresh keep-alive, and the
    # survivor's worker, not connected yet to the store that rank 0 hosted, would retry for 30 minutes
    watch = silence.Watch(bound=BOUND)
    watch.begin(7, A, {B: 0, A: 1, C: 2}, {A: 1, B: 1, C: 1}, 0.0)  # torch's participants: node -> rank
    assert watch.host == B
    found, now = [], 0.5
    while now <= 20 and not found:
        beats = {A: int(now), C: int(now)} | ({B: 1} if now < 1.0 else {})
        verdict = watch.observe(7, [A, C] if now >= 1.0 else [A, B, C], beats, None, now)
        if verdict is not None:
            found.append((now, verdict))
        now += silence.POLL_SECONDS
    assert found, "the host's workers' store gone, this node's waiting workers were never stopped"
    at, verdict = found[0]
    assert verdict.kind == silence.LOST and verdict.nodes == ("b",), verdict
    assert 1.0 + silence.LOST_AFTER_SECONDS <= at <= 1.0 + silence.LOST_AFTER_SECONDS + 0.5, at
    assert "hosts the workers' store" in verdict.cause()
    # a member other than the host that leaves is left to the step boundary (it writes no checkpoint here,
    # but this node's rank 0 may be writing the one of the step they stopped at)
    other = silence.Watch(bound=BOUND)
    other.begin(7, A, {A: 0, B: 1, C: 2}, {A: 1, B: 1, C: 1}, 0.0)
    now = 0.5
    while now <= 30:
        assert other.observe(7, [A, B], {A: int(now), B: int(now)}, None, now) is None, now
        now += silence.POLL_SECONDS


def test_another_member_gone_while_this_nodes_workers_start_is_lost_after_the_bound_and_not_once_formed() -> (
    None
):
    # issue 54: a member other than the host lost as the workers start leaves them waiting for its rank in
    # the workers' store (rank 0's worker for it, the others for rank 0's group); once they formed their
    # group, its loss fails a collective and a leave on purpose comes at a step boundary: nothing is judged
    def run(starting: bool) -> list[tuple[float, silence.Verdict]]:
        watch = silence.Watch(bound=BOUND)
        watch.begin(7, A, {A: 0, B: 1, C: 2}, {A: 1, B: 1, C: 1}, 0.0)
        found, now = [], 0.5
        while now <= 30 and not found:
            beats = {A: int(now), B: int(now)} | ({C: 1} if now < 1.0 else {})
            verdict = watch.observe(
                7, [A, B] if now >= 1.0 else [A, B, C], beats, None, now, starting=starting
            )
            if verdict is not None:
                found.append((now, verdict))
            now += silence.POLL_SECONDS
        return found

    found = run(starting=True)
    assert found, "a member lost as the workers started was never judged"
    at, verdict = found[0]
    assert verdict.kind == silence.LOST and verdict.nodes == ("c",) and not verdict.host, verdict
    assert 1.0 + silence.LOST_AFTER_SECONDS <= at <= 1.0 + silence.LOST_AFTER_SECONDS + 0.5, at
    assert "before this node's workers formed their group" in verdict.cause()
    assert run(starting=False) == []


def test_a_stop_for_a_lost_host_is_a_loss_in_the_book(tmp_path: Path) -> None:
    book = Book(tmp_path / "state.json", elastic=True)
    book.rendezvoused(2)
    why = silence.Verdict(silence.LOST, ("b (pid 1)",), 6.0).cause()
    book.failed({1: (-9, "")}, stopped=True, why=why, silent=False)
    assert book.rendezvoused(1) == (inplace.RESIZED, 1)
    assert book.state.resize == contract.RESIZE_LOST


def test_a_member_removed_after_its_keep_alive_stopped_is_silent() -> None:
    # another agent's read dropped c (torch's sanitizer, past the bound) and wrote the state back
    watch = _watch()
    verdict = None
    now = 0.0
    while verdict is None and now < 10:
        now += silence.POLL_SECONDS
        alive = now < 4.0
        beats = {A: int(now), B: int(now)} | ({C: 1} if alive else {})
        verdict = watch.observe(7, [A, B, C] if alive else [A, B], beats, None, now)
    assert verdict is not None and verdict.kind == silence.SILENT and verdict.nodes == ("c",), verdict
    assert now <= silence.LEFT_FRESH_SECONDS + 1.5, now


def test_an_agent_dropped_from_its_round_knows_it() -> None:
    watch = _watch()
    verdict = watch.observe(8, [B, C], {B: 5, C: 5}, None, 30.0)  # the others met round 8 without it
    assert verdict is not None and verdict.kind == silence.DROPPED
    assert "dropped from its round as silent" in verdict.cause()
    same_round = _watch().observe(7, [B, C], {B: 5, C: 5}, None, 30.0)
    assert same_round is not None and same_round.kind == silence.DROPPED


def test_an_agent_that_stalled_itself_judges_nobody_from_the_gap() -> None:
    watch = _watch()
    # this agent could not run for 20 s: nobody's keep-alive advanced in its eyes
    assert watch.observe(7, [A, B, C], {A: 1, B: 1, C: 1}, None, 20.0) is None
    assert watch.observe(7, [A, B, C], {A: 2, B: 2, C: 2}, None, 20.5) is None


def test_the_mark_of_another_agent_is_followed() -> None:
    watch = _watch()
    verdict = watch.observe(7, [A, B, C], {A: 1, B: 1, C: 1}, "c-host (pid 1)", 0.5)
    assert verdict is not None and verdict.kind == silence.SILENT and not verdict.judged_here
    assert verdict.nodes == ("c-host (pid 1)",) and "another node's agent saw it first" in verdict.cause()
    assert silence.mark_key("job-1", 7) == "ddpjob/silent/job-1/7"


def test_an_agent_before_its_first_round_judges_nothing() -> None:
    watch = silence.Watch(bound=BOUND)
    assert not watch.due(100.0)
    assert watch.observe(1, [A], {A: 1}, None, 100.0) is None


def test_a_stop_for_a_silent_peer_is_a_resize_or_unchanged_never_a_restart(tmp_path: Path) -> None:
    book = Book(tmp_path / "state.json", elastic=True)
    book.rendezvoused(3)
    why = silence.Verdict(silence.SILENT, ("c (pid 1)",), 5.5).cause()
    book.failed({0: (-9, "")}, stopped=True, why=why)
    assert book.rendezvoused(2) == (inplace.RESIZED, 1)
    # the woken node: dropped, its stale workers stopped, it meets a world of its old size again
    book.failed({0: (-9, "")}, stopped=True, why=silence.Verdict(silence.DROPPED, ("a",), 0.0).cause())
    assert book.rendezvoused(2) == (inplace.UNCHANGED, 1)
    assert inplace.read_state({contract.LAUNCH_STATE_ENV: str(tmp_path / "state.json")}).restarts == 0
