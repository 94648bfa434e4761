"""bench/elastic_bench.py's pure parts: the figures read from a run's log lines, and what ``--mode silent``
prints from its rounds. No job runs here: the log lines are written by hand, as the trainer writes them."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))  # as the bench scripts import it

import elastic_bench

DAY = "2026-12-03"
LINES = [
    f"{DAY} 10:00:01,000 [rank 0] INFO first optimizer step of this run: step 1 (resumed from 0)",
    f"{DAY} 10:00:10,000 [rank 0] INFO step 40: sync check ok",
    # the loss at 10:00:11; the smaller world resumes from the checkpoint at step 40
    f"{DAY} 10:00:20,500 [rank 0] INFO first optimizer step of this run: step 41 (resumed from 40)",
    f"{DAY} 10:00:30,000 [rank 0] INFO step 60: checkpoint saved",
    f"{DAY} 10:00:31,000 [rank 1] WARNING received SIGTERM: stopping at the next step boundary",
    f"{DAY} 10:00:31,200 [rank 0] WARNING received SIGTERM: stopping at the next step boundary",
    f"{DAY} 10:00:36,000 [rank 0] INFO first optimizer step of this run: step 61 (resumed from 60)",
]


def at(clock: str) -> float:
    return elastic_bench._when(f"{DAY} {clock},000")


def test_the_shrink_counts_from_the_loss_and_the_grow_from_the_first_sigterm_of_any_rank() -> None:
    got = elastic_bench.figures_from(LINES, at("10:00:11"), reached=42, elastic=True)
    assert got["recover_s"] == 9.5 and got["recover_steps"] == 2
    assert got["grow_s"] == 5.0 and got["grow_steps"] == 0  # stopped after step 60, resumed from 60
    rigid = elastic_bench.figures_from(LINES, at("10:00:11"), reached=42, elastic=False)
    assert "grow_s" not in rigid and rigid["recover_s"] == 9.5


def test_a_run_without_a_step_after_the_loss_has_no_figure() -> None:
    assert elastic_bench.figures_from(LINES, at("10:00:40"), reached=90, elastic=True) == {"reached": 90}


def test_the_report_gives_each_side_its_spread_the_ratio_and_the_goal_over_every_round() -> None:
    death = [
        {"code": 0, "recover_s": 4.0, "recover_steps": 0, "grow_s": 5.0},
        {"code": 0, "recover_s": 5.0, "recover_steps": 1},
    ]
    silent = [
        {"code": 0, "recover_s": 12.0, "recover_steps": 0},
        {"code": 0, "recover_s": 16.0, "recover_steps": 1},
    ]
    said = "\n".join(elastic_bench.silent_report(death, silent))
    assert "round 1 (death silent)" in said and "round 2 (silent death)" in said  # ABBA
    assert "death  loss → first step at the smaller world: 4.5 s [4.0-5.0]" in said
    assert "silent loss → first step at the smaller world: 14.0 s [12.0-16.0]" in said
    assert "grow 5.0 s [5.0-5.0] (1 of 2)" in said
    assert "ratio silent/death: 3.10 [3.00-3.20], 2 rounds" in said and "fewer than 5 rounds" in said
    assert "silent <= 15 s in every round: unresolved (max 16.0 s)" in said  # never rounded up to met


def test_a_round_without_a_figure_is_shown_and_left_out_of_the_spread() -> None:
    death = [{"code": 0, "recover_s": 4.0, "recover_steps": 0}, {"code": 1, "reached": 40}]
    silent = [
        {"code": 0, "recover_s": 11.0, "recover_steps": 0},
        {"code": 0, "recover_s": 30.0, "recover_steps": 0},
    ]
    said = "\n".join(elastic_bench.silent_report(death, silent))
    assert "1 round(s) without a shrink figure on a side: left out" in said
    assert "silent <= 15 s in every round: met (max 11.0 s)" in said
    assert "no complete round" in "\n".join(elastic_bench.silent_report(death[1:], silent[1:]))
