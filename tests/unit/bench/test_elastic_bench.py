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


HEALED_LINES = [
    f"{DAY} 10:00:01,000 [rank 0] INFO first optimizer step of this run: step 1 (resumed from 0)",
    # the loss at 10:00:11 (rank 0 scraped at step 42, then stepped on to 47 before the kill)
    f"{DAY} 10:00:13,250 [rank 0] elastic: world size 2 verified at step 47, before its first step "
    "(healed in place: 1 step(s) lost, 0 bytes sent, 2.10 s)",
    f"{DAY} 10:00:13,500 [rank 0] INFO first optimizer step of this run: step 48 (resumed from 47)",
    f"{DAY} 10:00:31,000 [rank 1] WARNING received SIGTERM: stopping at the next step boundary",
    f"{DAY} 10:00:35,000 [rank 0] INFO first optimizer step of this run: step 81 (resumed from 80)",
]


def test_a_healed_world_starts_at_its_verified_line_and_loses_the_steps_it_says() -> None:
    """A healed world's first step (after its healed line) ends the shrink, and its own count is the steps
    lost (rank 0's scraped step lags the kill); the grow back after it is measured as a restart's."""
    got = elastic_bench.figures_from(HEALED_LINES, at("10:00:11"), reached=42, elastic=True)
    assert got["recover_s"] == 2.5 and got["recover_steps"] == 1 and got["healed"] is True, got
    assert got["grow_s"] == 4.0, got
    restarted = elastic_bench.figures_from(LINES, at("10:00:11"), reached=42, elastic=True)
    assert "healed" not in restarted


def test_the_heal_report_judges_the_ratio_and_the_steps_lost_over_every_round() -> None:
    restart = [{"recover_s": 4.0, "recover_steps": 3}, {"recover_s": 5.0, "recover_steps": 2}]
    heal = [
        {"recover_s": 1.6, "recover_steps": 1, "healed": True},
        {"recover_s": 2.0, "recover_steps": 0, "healed": True},
    ]
    said = "\n".join(elastic_bench.heal_report(restart, heal))
    assert "round 1 (restart heal)" in said and "round 2 (heal restart)" in said, said
    assert "heal    loss → first step at the smaller world: 1.8 s [1.6-2.0]" in said, said
    assert "ratio heal/restart: 0.40 [0.40-0.40], 2 rounds" in said and "met" in said, said
    assert "heal steps lost <= 1 per loss in every round: met (max 1)" in said, said
    slow = [{"recover_s": 3.0, "recover_steps": 2}, heal[1]]  # round 1 restarted instead of healing
    said = "\n".join(elastic_bench.heal_report(restart, slow))
    assert "1 heal round(s) restarted instead of healing" in said, said
    assert "heal steps lost <= 1 per loss in every round: unresolved (max 2)" in said, said


GROWN_LINES = [
    *HEALED_LINES[:3],
    f"{DAY} 10:00:30,000 [launcher] a node waits to join the world; this pod's workers leave their group at "
    "the next step boundary: healing this pod's workers in place (no restart): meeting the next round",
    f"{DAY} 10:00:30,100 [launcher] a node waits to join the world; this pod's workers leave their group at "
    "the next step boundary: healing this pod's workers in place (no restart): meeting the next round",
    f"{DAY} 10:00:31,900 [rank 0] elastic: world size 3 verified at step 80, before its first step "
    "(healed in place: 0 step(s) lost, 82992 bytes sent, 1.80 s)",
    f"{DAY} 10:00:32,000 [rank 0] INFO first optimizer step of this run: step 81 (resumed from 80)",
]


def test_a_healed_grow_pauses_from_the_first_launchers_request_and_loses_what_its_line_says() -> None:
    got = elastic_bench.figures_from(GROWN_LINES, at("10:00:11"), reached=42, elastic=True)
    assert got["grow_s"] == 2.0 and got["grow_steps"] == 0 and got["grow_healed"] is True, got
    restart = [{"recover_s": 4.0, "recover_steps": 3, "grow_s": 5.0, "grow_steps": 0}]
    heal = [
        {
            "recover_s": 1.6,
            "recover_steps": 1,
            "healed": True,
            "grow_s": 2.0,
            "grow_steps": 0,
            "grow_healed": True,
        }
    ]
    said = "\n".join(elastic_bench.heal_report(restart * 2, heal * 2))
    assert (
        "heal steps lost <= 0 per grow in every healed grow (2 of 2): met (max 0); its pause 2.0 s" in said
    ), said
    lost = [{**heal[0], "grow_steps": 1}, heal[0]]
    said = "\n".join(elastic_bench.heal_report(restart * 2, lost))
    assert "per grow in every healed grow (2 of 2): unresolved (max 1)" in said, said
