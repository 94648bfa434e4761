"""bench/paired.py: the ABBA order, the ratios, and a verdict that says "met" only when every round clears
the goal. The samplers are seeded random draws, not clocks, so every outcome here is fixed."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))  # as the bench scripts import it

import paired


def draws(seed: int, mean: float, noise: float = 0.05) -> Callable[[], float]:
    """A sampler of costs around ``mean``, log-normal with ``noise`` (about the relative spread)."""
    rng = random.Random(seed)
    return lambda: mean * rng.lognormvariate(0.0, noise)


@pytest.mark.parametrize("seed", range(10))
def test_two_sides_from_one_distribution_are_unresolved_against_parity(seed: int) -> None:
    same = paired.compare(draws(seed, 1.0), draws(1000 + seed, 1.0), over="a/b", goal=1.0, rounds=9, warmup=1)
    assert same.verdict == "unresolved", same.said()
    assert same.low < 1.0 < same.high
    assert same.median == pytest.approx(1.0, abs=0.1)
    assert same.rounds == 9


def test_two_sides_from_one_distribution_are_unresolved_at_a_two_percent_goal() -> None:
    """The loop benchmark's goal (B keeps >= 0.98 of A's speed) with 10 % noise: not met, not unmet."""
    same = paired.compare(draws(7, 1.0, 0.10), draws(8, 1.0, 0.10), over="a/b", goal=0.98, rounds=5)
    assert same.verdict == "unresolved", same.said()


def test_a_clearly_faster_side_meets_the_goal() -> None:
    faster = paired.compare(draws(1, 1.0), draws(2, 0.8), over="a/b", goal=1.1)
    assert faster.verdict == "met", faster.said()
    assert faster.low >= 1.1
    assert faster.median == pytest.approx(1.25, rel=0.1)


def test_a_clearly_slower_side_misses_the_goal() -> None:
    slower = paired.compare(draws(3, 1.0), draws(4, 1.25), over="a/b", goal=0.98)
    assert slower.verdict == "unmet", slower.said()
    assert slower.high < 0.98


def test_an_overhead_goal_at_most() -> None:
    """B's cost over A's, goal <= 1.02 (the HF callback's): a 20 % overhead is unmet, none is met."""
    costly = paired.compare(
        draws(5, 1.0, 0.01), draws(6, 1.2, 0.01), over="b/a", goal=1.02, direction="at most"
    )
    free = paired.compare(
        draws(5, 1.0, 0.001), draws(6, 1.0, 0.001), over="b/a", goal=1.02, direction="at most"
    )
    assert (costly.verdict, free.verdict) == ("unmet", "met"), (costly.said(), free.said())


def test_the_calls_run_in_abba_order_after_the_warm_up() -> None:
    calls: list[str] = []

    def side(name: str, cost: float) -> Callable[[], float]:
        def sample() -> float:
            calls.append(name)
            return cost

        return sample

    got_a, got_b = paired.run_rounds(side("A", 1.0), side("B", 2.0), rounds=6, warmup=1)
    assert calls == ["A", "B", *"ABBAABBAABBA"]
    assert (got_a, got_b) == ([1.0] * 6, [2.0] * 6)


def test_each_round_pairs_its_own_samples() -> None:
    """A round's ratio is of that round's two samples: a drift that hits both halves of a pair cancels."""
    a = [1.0, 2.0, 4.0, 8.0, 16.0]
    b = [1.1 * x for x in a]
    figure = paired.judge(a, b, over="b/a", goal=1.2, direction="at most")
    assert figure.ratios == pytest.approx([1.1] * 5)
    assert (figure.median, figure.low, figure.high) == pytest.approx((1.1, 1.1, 1.1))
    assert figure.verdict == "met"
    assert paired.judge(a, b, over="a/b", goal=None).median == pytest.approx(1 / 1.1)


@pytest.mark.parametrize(
    ("low", "high", "goal", "direction", "expected"),
    [
        (0.98, 1.10, 0.98, "at least", "met"),  # the goal itself clears it
        (0.97, 1.10, 0.98, "at least", "unresolved"),
        (0.90, 0.979, 0.98, "at least", "unmet"),
        (0.90, 1.02, 1.02, "at most", "met"),
        (0.90, 1.03, 1.02, "at most", "unresolved"),
        (1.021, 1.10, 1.02, "at most", "unmet"),
        (0.5, 2.0, None, "at least", "no goal"),
    ],
)
def test_the_verdict_needs_the_whole_spread(
    low: float, high: float, goal: float | None, direction: paired.Direction, expected: str
) -> None:
    assert paired.verdict(low, high, goal, direction) == expected


def test_the_median_alone_never_makes_a_goal_met() -> None:
    """Four rounds of five clear the goal and the median does too: still unresolved, not met."""
    figure = paired.judge([1.0] * 5, [1.0, 1.0, 1.0, 1.0, 1.5], over="a/b", goal=0.98)
    assert figure.median == 1.0
    assert figure.verdict == "unresolved"


def test_fewer_than_five_rounds_and_meaningless_samples_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 5"):
        paired.run_rounds(lambda: 1.0, lambda: 1.0, rounds=4)
    with pytest.raises(ValueError, match="positive"):
        paired.judge([1.0, 1.0, -0.5, 1.0, 1.0], [1.0] * 5, over="b/a", goal=1.0)
    with pytest.raises(ValueError, match="paired"):
        paired.judge([1.0] * 5, [1.0] * 4, over="b/a", goal=1.0)


def test_said_and_as_json_carry_the_figure() -> None:
    figure = paired.judge([2.0, 2.0, 2.0, 2.0, 2.0], [1.9, 2.0, 2.1, 2.0, 2.0], over="a/b", goal=0.98)
    line = figure.said()
    assert line.startswith("1.000 [0.952-1.053], 5 rounds, goal >= 0.980: unresolved"), line
    got = figure.as_json()
    assert {k: got[k] for k in ("rounds", "verdict", "goal", "direction", "over")} == {
        "rounds": 5,
        "verdict": "unresolved",
        "goal": 0.98,
        "direction": "at least",
        "over": "a/b",
    }
    assert (got["median"], got["low"], got["high"]) == (figure.median, figure.low, figure.high)
    with pytest.raises(AttributeError):
        figure.verdict = "met"  # type: ignore[misc]  # frozen


def test_timed_calls_the_sync_around_the_work() -> None:
    seen: list[str] = []
    sample = paired.timed(lambda: seen.append("work"), sync=lambda: seen.append("sync"))
    seconds = sample()
    assert seen == ["sync", "work", "sync"]
    assert 0 <= seconds < 1
