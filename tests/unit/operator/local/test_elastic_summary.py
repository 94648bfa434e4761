"""``ddpjob local``'s elastic summary line (local/elastic.py): each world from rank 0's log lines in time
order, those healed in place marked, and what the heals cost in all. The log lines are written by hand, as
the trainer writes them."""

from __future__ import annotations

from pathlib import Path

from ddp_operator.local import elastic

DAY = "2026-12-05"


def test_the_summary_marks_the_healed_worlds_and_adds_up_what_their_heals_cost(tmp_path: Path) -> None:
    pod0, pod1 = tmp_path / "pod-0.log", tmp_path / "pod-1.log"
    pod0.write_text(
        f"{DAY} 10:00:01,000 [rank 0] INFO elastic: world size 3 verified at step 0, before its first step; "
        "global batch 48 samples\n"
        f"{DAY} 10:00:09,000 [rank 0] elastic: world size 2 verified at step 47, before its first step "
        "(healed in place: 1 step(s) lost, 0 bytes sent, 2.10 s)\n"
    )
    # the grown world's rank 0 is a joiner in another pod: its line is later, in another file
    pod1.write_text(
        f"{DAY} 10:00:20,000 [rank 0] elastic: world size 3 verified at step 80, before its first step "
        "(healed in place: 0 step(s) lost, 82992 bytes sent, 1.80 s)\n"
    )
    healed: elastic.Healed = {}
    found = elastic.worlds([pod1, pod0], healed)
    assert found == [(3, 0), (2, 47), (3, 80)]
    assert healed == {(2, 47): (1, 0), (3, 80): (0, 82992)}
    line = elastic.summary(found, healed)
    assert line.startswith("elastic: ran at world sizes 3 → 2 (healed) → 3 (healed) (ranks), each verified")
    assert line.endswith("; 2 healed in place: 1 step(s) lost, 82992 bytes of state sent in all"), line
    assert "healed in place" not in elastic.summary(found, {})
