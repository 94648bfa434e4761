"""The gang-restart decision, shared by the operator and ``ddpjob local``. Pure.

An attempt is one Indexed Job: all pods start together and one failed pod fails the attempt. Then:

- a sync divergence under ``onDivergence: Fail`` fails the DDPJob at once: restarting would resume the
  same diverged training, so the operator says what diverged instead of burning restarts;
- an invalid spec fails at once as well: no restart can fix it, and neither can one after the deadline;
- any other failure starts attempt + 1 (resuming from the last good checkpoint) while restarts are left.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The trainer's exit code for a divergence under Fail (ddp_trainer.exitcodes.DIVERGENCE_EXIT_CODE; a test
# keeps the two equal). torchrun reports any child failure as 1, so the termination message is the
# signal that survives; the code is honoured for scripts that run without torchrun.
DIVERGENCE_EXIT_CODE = 86


class Action(enum.Enum):
    SUCCEED = "Succeed"
    RESTART = "Restart"
    FAIL = "Fail"


@dataclass(frozen=True)
class Outcome:
    """How one attempt ended, as observed: per-pod exit codes and rank 0's termination report."""

    succeeded: bool
    exit_codes: Mapping[int, int] = field(default_factory=dict)
    report: Mapping[str, Any] | None = None
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    message: str


def parse_report(text: str | None) -> dict[str, Any] | None:
    """The trainer's JSON report from a termination message, or None when it is not one (a crash log)."""
    if not text:
        return None
    try:
        report = json.loads(text)
    except ValueError:
        return None
    return report if isinstance(report, dict) and "result" in report else None


def diverged(outcome: Outcome) -> bool:
    """True when the replicas diverged and the job's policy was to stop."""
    if outcome.report is not None and outcome.report.get("result") == "Diverged":
        return True
    return DIVERGENCE_EXIT_CODE in outcome.exit_codes.values()


def decide(outcome: Outcome, attempt: int, max_restarts: int) -> Decision:
    """What to do after ``attempt`` (1-based) ended with ``outcome``; restarts so far are attempt - 1."""
    if outcome.succeeded:
        return Decision(Action.SUCCEED, "Completed", f"attempt {attempt} completed")
    if diverged(outcome):
        detail = (outcome.report or {}).get("message") or "the replicas are no longer bit-identical"
        return Decision(Action.FAIL, "SyncDivergence", f"attempt {attempt}: {detail}; not restarting")
    if outcome.reason == "InvalidSpec":
        return Decision(Action.FAIL, "InvalidSpec", outcome.message or "the spec is invalid; not restarting")
    if outcome.reason == "DeadlineExceeded":
        return Decision(Action.FAIL, "DeadlineExceeded", "activeDeadlineSeconds passed; not restarting")
    why = outcome.message or _failed_pods(outcome)
    restarts = attempt - 1
    if restarts < max_restarts:
        return Decision(
            Action.RESTART,
            outcome.reason or "AttemptFailed",
            f"attempt {attempt} failed ({why}); gang restart {restarts + 1} of {max_restarts}",
        )
    return Decision(
        Action.FAIL,
        "MaxRestartsExceeded" if max_restarts else (outcome.reason or "AttemptFailed"),
        f"attempt {attempt} failed ({why}) and {max_restarts} restart(s) are used up",
    )


def _failed_pods(outcome: Outcome) -> str:
    failed = {index: code for index, code in sorted(outcome.exit_codes.items()) if code != 0}
    if not failed:
        return "no pod reported an exit code"
    return ", ".join(f"node {index} exited {code}" for index, code in failed.items())
