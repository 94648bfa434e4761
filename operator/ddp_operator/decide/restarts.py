"""The gang-restart decision, shared by the operator and ``ddpjob local``. Pure.

An attempt is one Indexed Job: all pods start together and one failed pod fails the attempt. Then:

- a sync divergence under ``onDivergence: Fail`` fails the DDPJob at once: restarting would resume the
  same diverged training, so the operator says what diverged instead of burning restarts;
- an invalid spec fails at once as well: no restart can fix it, and neither can one after the deadline;
- so does a configuration error: a refused checkpoint (another job's, or this job's written with other
  settings: every attempt would find the same files in the same volume), a refused command line, any pod
  that exits with one of ``contract.CONFIGURATION_EXIT_CODES`` (2 usage, 78 refused; the Job's
  ``podFailurePolicy`` fails the Job on them too);
- a faulty rank named by the compute probe under ``onFaultyRank: Fail`` (report reason ``FaultyRank``,
  exit code 87) restarts the gang while restarts are left; the next attempt's pods avoid the node
  (:func:`faulty_nodes`, ``status.probe.faultyNodes``, ``render.avoiding``);
- a preemption (a pod deleted gracefully or evicted: the trainer checkpointed at SIGTERM) restarts the
  gang without using up ``maxRestarts``;
- an elastic attempt whose Job ended while rank 0's report does not say its training did
  (``decide.ending``: ``EndedEarly``) is a failure like any other below; one that trained to the end with
  its replicas not verified (``NotVerified``) fails the DDPJob: a new gang would train nothing more;
- any other failure starts attempt + 1 (resuming from the last good checkpoint) while restarts are left;
  the restarts done in place inside the attempts' pods (torchrun's agents, ``ddp_trainer.launch``) count
  against the same ``maxRestarts`` (:func:`restarts_used`), and the next Job's agents get what is left.

And what the operator's status says of gang restarts: ``status.restarts`` (:func:`shown`), the restarts
done in place that the pods report (:func:`in_place_seen`, counted into ``status.restartsInPlace`` and
``status.lastRestart`` by :func:`restarted_in_place`, with where the restarted workers' state came from),
both asked once per reconcile (:func:`budget`), and a new attempt's (:func:`recreated`).

Long because the decision and the status's count of restarts share one budget (``maxRestarts`` less the
attempts and the restarts done in place, :func:`restarts_used`): split, the count the decision spends and
the count the status shows could drift.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from ddp_operator.api import exits, reasons, typed_status
from ddp_operator.api.typed_status import LastRestart, Status
from ddp_operator.decide.plan import Event
from ddp_operator.decide.status_builder import Said, StatusBuilder, count
from ddp_operator.observe import failures
from ddp_operator.observe.facts import Facts
from ddp_operator.observe.live import Snapshot
from ddp_operator.observe.outcome import Outcome as Outcome
from ddp_trainer import contract


class Action(enum.Enum):
    SUCCEED = "Succeed"
    RESTART = "Restart"
    FAIL = "Fail"


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    message: str


def diverged(outcome: Outcome) -> bool:
    """True when the replicas diverged and the job's policy was to stop."""
    if outcome.report is not None and outcome.report.get("result") == contract.DIVERGED:
        return True
    return contract.DIVERGENCE_EXIT_CODE in outcome.exit_codes.values()


def configuration_error(outcome: Outcome) -> str:
    """Why the attempt can never succeed as configured, else ``""``: the report's reason
    (``ForeignCheckpoint``, ``SettingsChanged``, ``InvalidArguments``), or what a configuration exit code
    (``contract.CONFIGURATION_EXIT_CODES``) or the Job's ``podFailurePolicy`` says."""
    reason = (outcome.report or {}).get("reason")
    if reason in contract.CONFIGURATION_REASONS:
        return str(reason)
    codes = set(outcome.exit_codes.values())
    if contract.CHECKPOINT_REFUSED_EXIT_CODE in codes:
        return reasons.CHECKPOINT_REFUSED
    if contract.USAGE_EXIT_CODE in codes:
        return reasons.USAGE_ERROR
    if outcome.reason == POD_FAILURE_POLICY:
        return reasons.CONFIGURATION_ERROR
    return ""


def faulty_rank(outcome: Outcome) -> bool:
    """The compute probe named a faulty rank and the job's policy was to stop the attempt."""
    if (outcome.report or {}).get("reason") == contract.FAULTY_RANK:
        return True
    return contract.FAULTY_RANK_EXIT_CODE in outcome.exit_codes.values()


def faulty_nodes(outcome: Outcome) -> tuple[str, ...]:
    """The nodes of the faulty ranks the report names (empty names, from outside a pod, left out)."""
    nodes = (outcome.report or {}).get("faultyNodes") or []
    return tuple(dict.fromkeys(str(n) for n in nodes if isinstance(n, str) and n))


POD_FAILURE_POLICY = reasons.POD_FAILURE_POLICY
_CONFIGURATION_WORDS = {
    reasons.USAGE_ERROR: "exit code 2 is a usage error, which no restart can fix",
    reasons.CHECKPOINT_REFUSED: "exit code 78 means the checkpoint was refused, which no restart can fix",
    reasons.CONFIGURATION_ERROR: (
        "a configuration exit code (the Job's podFailurePolicy), which no restart can fix"
    ),
}


def preempted(outcome: Outcome) -> bool:
    """The attempt was stopped from outside (a pod deleted gracefully, evicted, preempted): rank 0 saved a
    checkpoint at SIGTERM and reported ``Interrupted``, or Kubernetes marked a pod ``DisruptionTarget``; and
    no pod failed on its own (a crash stops the others with SIGTERM too: that is no preemption)."""
    if outcome.crashed or outcome.reason == reasons.ENDED_EARLY:  # its pods ended, none was stopped
        return False
    if outcome.reason == PREEMPTED:
        return True
    return outcome.report is not None and outcome.report.get("result") == contract.INTERRUPTED


PREEMPTED = reasons.PREEMPTED


def shown(attempt: int, in_place: int) -> int:
    """``status.restarts``: every gang restart so far, the new attempts before ``attempt`` (preemptions
    included: restarts too, only free) and the ``in_place`` ones inside the same pods."""
    return contract.restarts_before(attempt) + in_place


def left(max_restarts: int, used: int) -> int:
    """What the next Job's agents may restart in place (torchrun's ``--max-restarts``): what is left of
    ``maxRestarts`` after ``used`` (:func:`restarts_used`)."""
    return max(0, max_restarts - used)


@dataclass(frozen=True)
class Budget:
    """:func:`budget`: ``status.restarts`` (:func:`shown`), what is left of ``maxRestarts`` (:func:`left`),
    and the restarts in place the status does not count yet (:func:`restarted_in_place`)."""

    shown: int
    left: int
    in_place: Said


def budget(out: StatusBuilder, max_restarts: int, facts: Facts, snapshot: Snapshot | None) -> Budget:
    """:func:`shown` and :func:`left` (after :func:`restarts_used`) of the ``facts``' attempt from the
    previous status's counts (``out``'s), and the restarts in place its pods reported, at once."""
    attempt, (preemptions, in_place) = facts.attempt, out.counted
    before = contract.restarts_before(attempt)
    seen, cause, source = in_place_seen(attempt, facts.report, snapshot)
    said = restarted_in_place(out, attempt, seen, cause, max_restarts, before + in_place, source)
    return Budget(before + in_place, left(max_restarts, before - preemptions + in_place), said)


def restarts_used(attempt: int, preemptions: int = 0, in_place: int = 0) -> int:
    """Gang restarts counted against ``maxRestarts`` before ``attempt`` ends: the attempts before it but
    the preemptions, plus the restarts done in place (same pods) in every attempt so far."""
    return contract.restarts_before(attempt) - preemptions + in_place


def decide(
    outcome: Outcome, attempt: int, max_restarts: int, preemptions: int = 0, in_place: int = 0
) -> Decision:
    """What to do after ``attempt`` (1-based) ended with ``outcome``; restarts so far are attempt - 1, of
    which ``preemptions`` were preemptions (they do not count against ``max_restarts``), plus ``in_place``
    restarts inside the same pods (:func:`restarts_used`)."""
    if outcome.succeeded:
        return Decision(Action.SUCCEED, reasons.COMPLETED, f"attempt {attempt} completed")
    if diverged(outcome):
        detail = (outcome.report or {}).get("message") or "the replicas are no longer bit-identical"
        return Decision(Action.FAIL, reasons.SYNC_DIVERGENCE, f"attempt {attempt}: {detail}; not restarting")
    refused = configuration_error(outcome)
    if refused:
        detail = (outcome.report or {}).get("message") or (
            f"{outcome.message or _failed_pods(outcome)}: {_CONFIGURATION_WORDS.get(refused, refused)}"
        )
        return Decision(Action.FAIL, refused, f"attempt {attempt}: {detail}; not restarting")
    if outcome.reason == reasons.INVALID_SPEC:
        return Decision(
            Action.FAIL, reasons.INVALID_SPEC, outcome.message or "the spec is invalid; not restarting"
        )
    if outcome.reason == reasons.NOT_VERIFIED:  # trained to the end: a new gang would train nothing more
        message = f"attempt {attempt}: {outcome.message}; not restarting"
        return Decision(Action.FAIL, reasons.NOT_VERIFIED, message)
    if outcome.reason == reasons.BELOW_MIN_NODES:  # a new gang would wait for the same missing nodes
        return Decision(Action.FAIL, reasons.BELOW_MIN_NODES, f"attempt {attempt}: {outcome.message}")
    if outcome.reason == reasons.DEADLINE_EXCEEDED:
        return Decision(
            Action.FAIL, reasons.DEADLINE_EXCEEDED, "activeDeadlineSeconds passed; not restarting"
        )
    if faulty_rank(outcome):
        return _away_from_faulty(outcome, attempt, max_restarts, preemptions)
    if preempted(outcome):
        return Decision(
            Action.RESTART,
            PREEMPTED,
            f"attempt {attempt} was stopped from outside (pod deleted, evicted or preempted) and saved a "
            "checkpoint; restarting the gang from it (preemptions do not count against maxRestarts)",
        )
    why = outcome.message or _failed_pods(outcome)
    report = outcome.report or {}
    if cause := failures.describe(report.get("failures") or []):  # a user's command: who failed first
        why = f"{cause}; {why}"
    elif report.get("result") == contract.FAILED and report.get("message"):
        reason = report.get("reason", reasons.TRAINER_ERROR)
        said = "in your command" if reason == contract.COMMAND_ERROR else reason
        why += f"; rank 0: {said}: {report['message']}"
    restarts = restarts_used(attempt, preemptions, in_place)
    if restarts < max_restarts:
        return Decision(
            Action.RESTART,
            outcome.reason or reasons.ATTEMPT_FAILED,
            f"attempt {attempt} failed ({why}); gang restart {restarts + 1} of {max_restarts}",
        )
    return Decision(
        Action.FAIL,
        reasons.MAX_RESTARTS_EXCEEDED if max_restarts else (outcome.reason or reasons.ATTEMPT_FAILED),
        f"attempt {attempt} failed ({why}) and {max_restarts} restart(s) are used up",
    )


def _away_from_faulty(outcome: Outcome, attempt: int, max_restarts: int, preemptions: int) -> Decision:
    detail = (outcome.report or {}).get("message") or "the compute probe named a faulty rank"
    nodes = faulty_nodes(outcome)
    where = f"away from node(s) {', '.join(nodes)}" if nodes else "(its node is not known: none avoided)"
    restarts = contract.restarts_before(attempt) - preemptions
    if restarts < max_restarts:
        return Decision(
            Action.RESTART,
            contract.FAULTY_RANK,
            f"attempt {attempt}: {detail}; gang restart {restarts + 1} of {max_restarts}, {where}",
        )
    return Decision(
        Action.FAIL,
        contract.FAULTY_RANK,
        f"attempt {attempt}: {detail}; {max_restarts} restart(s) are used up",
    )


def _failed_pods(outcome: Outcome) -> str:
    failed = {index: code for index, code in sorted(outcome.exit_codes.items()) if code != 0}
    if not failed:
        return "no pod reported an exit code"
    return ", ".join(f"node {index} {exits.exited(code)}" for index, code in failed.items())


# -- what the status says of gang restarts ------------------------------------------------------------

RESTARTS_IN_PLACE_FIELD = typed_status.key(Status, "restarts_in_place")
"""``status.restartsInPlace``: the job's gang restarts done in place, over all its attempts (each attempt's
count is its pods' report, :data:`ddp_trainer.contract.REPORT_RESTARTS_IN_PLACE`, or their metric); the
operator's metrics read it (``runtime/opmetrics``)."""
IN_PLACE, RECREATE = "InPlace", "Recreate"
RESTARTED_IN_PLACE = reasons.RESTARTED_IN_PLACE
"""The reason (and the event's) of a gang restart done in place."""
LAST_RESTART_FIELD = typed_status.key(Status, "last_restart")
"""``status.lastRestart``: the last gang restart, in place or by a new Job."""


def in_place_so_far(previous: Status, attempt: int) -> int:
    """The restarts in place of ``attempt`` the status already counts."""
    last = previous.last_restart
    if last is not None and last.kind == IN_PLACE and last.attempt == attempt:
        return count(last.in_attempt)
    return 0


RESUMING_FROM: Final = {
    contract.RESTART_FROM_CHECKPOINT: "resuming from the last checkpoint",
    contract.RESTART_FROM_OTHERS: (
        "the restarted workers join the others, which heal in place, and copy their state from a live "
        "replica (the last checkpoint where none is left)"
    ),
}
"""How a restart in place's event says where its workers' state comes from (``contract.RESTART_FROM``)."""


def resuming_from(source: object) -> str:
    """:data:`RESUMING_FROM` of ``source``; the checkpoint's for anything else (an older trainer's report)."""
    return RESUMING_FROM.get(str(source), RESUMING_FROM[contract.RESTART_FROM_CHECKPOINT])


def restarted_in_place(
    out: StatusBuilder,
    attempt: int,
    seen: int,
    cause: str,
    max_restarts: int,
    shown: int,
    source: str = contract.RESTART_FROM_CHECKPOINT,
) -> Said:
    """The restarts in place the pods of ``attempt`` reported (``seen`` so far in the attempt; the cause of
    the last, and where its workers' state came from: ``source``) beyond what the previous status
    (``out``'s) counts, counted: ``restarts`` (``shown`` before them), ``restartsInPlace``, ``lastRestart``
    and a Warning event."""
    known = in_place_so_far(out.last, attempt)
    if seen <= known:
        return Said()
    total = shown + seen - known
    why = cause or "a process failed"
    message = (
        f"attempt {attempt}: gang restarted in place ({seen} in this attempt, {total} of "
        f"maxRestarts {max_restarts} used): {why}; same pods, {resuming_from(source)}"
    )
    last = LastRestart(IN_PLACE, attempt, seen, RESTARTED_IN_PLACE, message[:1024], out.now)
    fields = dict(restarts_in_place=out.counted[1] + seen - known, restarts=total, last_restart=last)
    return Said(fields, events=(Event("Warning", RESTARTED_IN_PLACE, message),))


def recreated(out: StatusBuilder, attempt: int, reason: str, message: str) -> None:
    """The gang restarts as ``attempt`` (a new Job and new pods)."""
    out.set(last_restart=LastRestart(RECREATE, attempt, None, reason, message[:1024], out.now))


def in_place_seen(
    attempt: int, report: contract.Report | None, snapshot: Snapshot | None
) -> tuple[int, str, str]:
    """The restarts in place the pods of ``attempt`` reported (the metrics while it runs, rank 0's
    report at its end: the higher count wins), the cause of the last and where its workers' state came
    from."""
    report = report or {}
    seen, cause, source = 0, "", contract.RESTART_FROM_CHECKPOINT
    if snapshot is not None and snapshot.attempt == attempt and snapshot.latest is not None:
        latest = snapshot.latest
        seen, cause, source = latest.restarts_in_place, latest.restart_cause, latest.restart_from
    said = report.get(contract.REPORT_RESTARTS_IN_PLACE)
    if report.get("attempt") == attempt and isinstance(said, int) and said > seen:
        seen, cause = said, str(report.get(contract.REPORT_LAST_RESTART) or cause)
        source = str(report.get(contract.REPORT_LAST_RESTART_FROM) or contract.RESTART_FROM_CHECKPOINT)
    return seen, cause, source
