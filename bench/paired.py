"""One way to compare two sides, A and B: paired rounds in ABBA order, the median of the per-round ratios
with their spread, and a verdict that never rounds up (issue 43).

Why paired rounds: a machine's speed drifts between runs (the bare DDP loop alone moved +29 % between two
days with unchanged code), so two figures taken apart, or the best of a few of each, compare the drift as
much as the sides. Each round takes one sample of A and one of B next to each other, and their ratio is
the round's figure: a slow moment slows both halves of the pair alike.

Why ABBA (A B, B A, A B, B A, ...: the calls run A B B A A B B A ...): with a fixed order A B A B, B
always runs second, so a trend (a machine warming up or throttling, a neighbour starting) or a cost that
the first side leaves for the second (a cache, an allocator, a clock) lands on B every round. Alternating
the order cancels a linear trend over each pair of rounds and shows an order effect as a spread.

Why the spread decides: with a handful of rounds the median alone can land on either side of a goal by
chance; the min-max range of the per-round ratios is a rough interval. A goal is ``met`` only when every
round clears it, ``unmet`` when no round does, and ``unresolved`` otherwise: never reported as met.

Why the caller times: a sample is whatever the caller's zero-argument callable returns (seconds, or
seconds per step), so a CUDA caller times between ``torch.cuda.synchronize()`` calls or with CUDA events,
a CPU caller with ``time.perf_counter`` (:func:`timed`), and a caller that runs whole processes returns
what it measured inside them. Samples are costs (time per unit of work): positive, lower is faster.

Standard library only: the bench scripts and ``gpu_check.py`` (``python3`` on a bare GPU box) import it
from ``bench/``; the statistics and the verdict are pure functions, apart from the timing loop.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

MIN_ROUNDS = 5
"""Fewer rounds give a min-max spread too narrow to mean anything (issue 43 asks for at least 5)."""

Side = Literal["A", "B"]
Over = Literal["b/a", "a/b"]
"""Which ratio each round reports: ``b/a`` (B's cost over A's) or ``a/b`` (A's over B's: B's speed, as a
share of A's, when the samples are times)."""
Direction = Literal["at least", "at most"]
"""Which side of the goal is good: ``at least`` (ratio >= goal) or ``at most`` (ratio <= goal)."""
Verdict = Literal["met", "unresolved", "unmet", "no goal"]


def abba(rounds: int) -> list[tuple[Side, Side]]:
    """The order within each round: A B, then B A, then A B, ... (the calls run A B B A A B B A ...)."""
    return [("A", "B") if r % 2 == 0 else ("B", "A") for r in range(rounds)]


def run_rounds(
    a: Callable[[], float], b: Callable[[], float], *, rounds: int = MIN_ROUNDS, warmup: int = 1
) -> tuple[list[float], list[float]]:
    """Call each sampler ``warmup`` times (A then B, the results dropped), then once per round in ABBA
    order; returns (A's samples, B's samples), round by round. The only function here that runs anything."""
    if rounds < MIN_ROUNDS:
        raise ValueError(f"rounds={rounds}: at least {MIN_ROUNDS} paired rounds are needed")
    if warmup < 0:
        raise ValueError(f"warmup={warmup}: must be 0 or more")
    samplers: dict[Side, Callable[[], float]] = {"A": a, "B": b}
    for _ in range(warmup):
        a()
        b()
    samples: dict[Side, list[float]] = {"A": [], "B": []}
    for pair in abba(rounds):
        for side in pair:
            samples[side].append(float(samplers[side]()))
    return samples["A"], samples["B"]


def ratios(a: Sequence[float], b: Sequence[float], over: Over) -> list[float]:
    """The per-round ratios, round by round. Samples must be positive and finite: a ratio of a zero or
    negative cost (say, two wall times differenced inside their noise) means nothing, so it raises."""
    if over not in ("b/a", "a/b"):
        raise ValueError(f"over={over!r}: 'b/a' or 'a/b'")
    if len(a) != len(b) or not a:
        raise ValueError(f"paired samples needed: {len(a)} of A, {len(b)} of B")
    bad = [x for x in (*a, *b) if not (math.isfinite(x) and x > 0)]
    if bad:
        raise ValueError(f"samples must be positive and finite costs; got {bad}")
    pairs = list(zip(a, b, strict=True))
    return [y / x for x, y in pairs] if over == "b/a" else [x / y for x, y in pairs]


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max) of the per-round ratios."""
    if not values:
        raise ValueError("no ratios")
    return statistics.median(values), min(values), max(values)


def verdict(low: float, high: float, goal: float | None, direction: Direction) -> Verdict:
    """``met`` only when the whole spread [low, high] clears the goal (the goal itself counts as
    cleared), ``unmet`` when the whole spread misses it, else ``unresolved``; ``no goal`` without one."""
    if goal is None:
        return "no goal"
    if low > high:
        raise ValueError(f"low {low} > high {high}")
    if direction == "at least":
        if low >= goal:
            return "met"
        if high < goal:
            return "unmet"
    elif direction == "at most":
        if high <= goal:
            return "met"
        if low > goal:
            return "unmet"
    else:
        raise ValueError(f"direction={direction!r}: 'at least' or 'at most'")
    return "unresolved"


@dataclass(frozen=True)
class Paired:
    """One A-vs-B figure: the median per-round ratio, its spread, the rounds and the verdict."""

    median: float
    low: float
    high: float
    rounds: int
    verdict: Verdict
    goal: float | None
    direction: Direction
    over: Over = "b/a"
    ratios: tuple[float, ...] = ()
    a: tuple[float, ...] = ()
    """A's samples, round by round (the caller's unit)."""
    b: tuple[float, ...] = ()

    def said(self, digits: int = 3) -> str:
        """One line: ``0.991 [0.975-1.004], 5 rounds, goal >= 0.98: unresolved``."""
        f = f"{{:.{digits}f}}"
        sign = ">=" if self.direction == "at least" else "<="
        goal = f"goal {sign} {f.format(self.goal)}" if self.goal is not None else "no goal"
        figure = f"{f.format(self.median)} [{f.format(self.low)}-{f.format(self.high)}]"
        return f"{figure}, {self.rounds} rounds, {goal}: {self.verdict}"

    def as_json(self) -> dict[str, Any]:
        """The figure as plain JSON types (what ``gpu-check.json`` and ``--json`` files carry)."""
        return {
            "median": self.median,
            "low": self.low,
            "high": self.high,
            "rounds": self.rounds,
            "verdict": self.verdict,
            "goal": self.goal,
            "direction": self.direction,
            "over": self.over,
            "ratios": list(self.ratios),
            "a": list(self.a),
            "b": list(self.b),
        }


def judge(
    a: Sequence[float],
    b: Sequence[float],
    *,
    over: Over,
    goal: float | None,
    direction: Direction = "at least",
) -> Paired:
    """The figure of paired samples (pure: no timing)."""
    per_round = ratios(a, b, over)
    median, low, high = spread(per_round)
    return Paired(
        median=median,
        low=low,
        high=high,
        rounds=len(per_round),
        verdict=verdict(low, high, goal, direction),
        goal=goal,
        direction=direction,
        over=over,
        ratios=tuple(per_round),
        a=tuple(a),
        b=tuple(b),
    )


def compare(
    a: Callable[[], float],
    b: Callable[[], float],
    *,
    over: Over,
    goal: float | None,
    direction: Direction = "at least",
    rounds: int = MIN_ROUNDS,
    warmup: int = 1,
) -> Paired:
    """Run the paired rounds (:func:`run_rounds`) and judge them (:func:`judge`)."""
    got_a, got_b = run_rounds(a, b, rounds=rounds, warmup=warmup)
    return judge(got_a, got_b, over=over, goal=goal, direction=direction)


def timed(fn: Callable[[], object], sync: Callable[[], object] | None = None) -> Callable[[], float]:
    """A sampler: the seconds one call of ``fn`` takes by ``time.perf_counter``. With ``sync`` (say,
    ``torch.cuda.synchronize``) it is called before the clock starts and before it stops, so the time
    covers the device work ``fn`` queued, not only its host side."""

    def sample() -> float:
        if sync is not None:
            sync()
        started = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        return time.perf_counter() - started

    return sample
