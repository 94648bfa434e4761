"""The pods' metrics, read: what a person watching a run sees, training progress read from the pods' own
/metrics (the sync report in one sentence: :mod:`.sync_report`).

``ddpjob local`` and the operator (for ``status.progress``) scrape the same Prometheus endpoints a
cluster's Prometheus would and parse them here, so the progress line and the status show exactly what the
metrics say. Parsing and formatting are pure; ``scrape`` and ``fetch`` are the only I/O.

Long because every metric the trainer exports is read here into one ``Progress`` (the slowest rank, the
last resize, the checks by result), next to the progress line that shows it.
"""

from __future__ import annotations

import dataclasses
import http.client
import math
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from ddp_trainer import contract


@dataclass(frozen=True)
class LastResize:
    """An elastic world's change as its launchers recorded it (``ddp_resize_info``)."""

    reason: str
    """One of ``contract.RESIZE_REASONS`` (the launcher never says ``Scaled``)."""
    before: int
    after: int
    """The nodes of the world before and after."""
    at: float
    """Unix time the world before stopped."""
    seconds_lost: float | None
    """From then to the new world verified (``ddp_last_resize_seconds_lost``; the last change's only)."""
    round: int = -1
    """The rendezvous round the new world formed in: one change, whichever pods say it (-1: not known)."""
    mode: str = contract.RESIZE_RESTARTED
    """How the new world was made (``contract.RESIZE_MODES``; an older trainer says none: restarted)."""
    steps_lost: int | None = None
    """A world healed in place: steps its survivors trained that no rank kept (``ddp_last_resize_steps_lost``;
    the last change's only)."""
    bytes_sent: int | None = None
    """A world healed in place: bytes of state a live replica sent (``ddp_last_resize_bytes_sent``)."""


@dataclass(frozen=True)
class Progress:
    """Training progress across every rank that has reported."""

    step: int = 0
    samples: float = 0.0
    loss: float | None = None
    checks_ok: int = 0
    checks_mismatch: int = 0
    ranks: int = 0
    step_times: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    """Per rank: the sum and the count of ``ddp_step_duration_seconds`` (the step-time histogram)."""
    skew: float | None = None
    """``ddp_step_time_skew_ratio``: (slowest - fastest) / slowest mean step time between checks, 0-1."""
    last_check_time: float | None = None
    """Unix time of the last sync check (any rank: they check together)."""
    last_check_ok: bool | None = None
    """Whether the last sync check found every rank bit-identical (rank 0's verdict)."""
    last_check_step: int | None = None
    """The optimizer step at which the last sync check ran (rank 0's)."""
    repairs: int = 0
    mismatched_tensors: int = 0
    """Tensors that differed at the last check (names are in the final report only)."""
    max_abs_diff: float | None = None
    nonfinite_steps: int = 0
    """Steps whose loss was NaN or infinite (rank 0)."""
    total_steps: int | None = None
    """``ddp_total_steps``: the run's total as its code knows it (rank 0's), None where it does not say."""
    restarts_in_place: int = 0
    """``ddp_restarts_in_place``: gang restarts done in place in this attempt (the highest any pod says)."""
    restart_cause: str = ""
    """Why the last of them happened: of the pods' ``ddp_last_restart_info`` causes for it, the one that
    names the failing rank best (``contract.blame``)."""
    restart_from: str = contract.RESTART_FROM_CHECKPOINT
    """Where that restart's workers took their state from, as the pod of that cause says
    (``contract.RESTART_FROM``)."""

    world_size: int | None = None
    """The processes of the world that trains now, as rank 0 says it (``ddp_info``'s ``world_size``; the
    lowest rank's when rank 0's pod did not answer); None where no rank says it."""
    resizes: int = 0
    """``ddp_elastic_resizes``: an elastic job's world changes in this attempt (the highest any pod says)."""
    last_resize: LastResize | None = None
    """The last of them (the highest round; among pods that say no round, the one with the highest count)."""
    changes: tuple[LastResize, ...] = ()
    """Every world change any pod's launcher says, once per round, by round: what the operator counts,
    so a world that lived between two readings is counted too."""

    def total(self, spec_steps: int) -> int:
        """The total to show: what the code said, else the spec's (``spec.trainer.steps``)."""
        return self.total_steps or spec_steps

    def slowest(self) -> tuple[int, float] | None:
        """The rank with the longest mean step time, and that time (seconds); None before any step."""
        return slowest(self, None)

    def steps_per_second(self) -> float | None:
        """Rank 0's step rate from its step-time histogram (excludes what happens between steps)."""
        total, count = self.step_times.get("0") or next(iter(self.step_times.values()), (0.0, 0.0))
        return count / total if total > 0 and count > 0 else None


def slowest(now: Progress, earlier: Progress | None) -> tuple[int, float] | None:
    """The slowest rank and its mean step time, between two readings when ``earlier`` has fewer steps of
    that rank (a restarted rank's histogram starts over: then since its start)."""
    means: dict[str, float] = {}
    for rank, (total, count) in now.step_times.items():
        before = earlier.step_times.get(rank) if earlier else None
        if before and count > before[1] and total >= before[0]:
            total, count = total - before[0], count - before[1]
        if count > 0:
            means[rank] = total / count
    if not means:
        return None
    rank = max(means, key=lambda r: (means[r], -_rank_number(r)))
    return _rank_number(rank), means[rank]


def _rank_number(rank: str) -> int:
    try:
        return int(rank)
    except ValueError:
        return -1


def scrape(port: int, timeout: float = 0.5) -> str | None:
    """The text of http://127.0.0.1:PORT/metrics, or None while nothing answers there."""
    try:
        return fetch(f"http://127.0.0.1:{port}/metrics", timeout=timeout)
    except OSError:
        return None


SIZE_LIMIT = 1 << 20  # bytes: a trainer's exposition is a few KiB; anything larger is not read


def fetch(url: str, timeout: float = 2.0, limit: int = SIZE_LIMIT) -> str:
    """The text at ``url`` (at most ``limit`` bytes: OSError past that); OSError when nothing answers, or
    when what answers does not speak HTTP (another process on the port: ``http.client.BadStatusLine``)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body: bytes = response.read(limit + 1)
    except http.client.HTTPException as exc:
        raise OSError(f"{url} answered, but not in HTTP: {type(exc).__name__} {exc}") from exc
    if len(body) > limit:
        raise OSError(f"more than {limit} bytes")
    return body.decode(errors="replace")


def parse(texts: Iterable[str]) -> Progress:
    """Progress from the exposition texts of every pod (each pod shows all of its local ranks)."""
    steps: dict[str, float] = {}
    samples: dict[str, float] = {}
    losses: dict[str, float] = {}
    checks: dict[tuple[str, str, str], float] = {}
    gauges: dict[str, dict[str, float]] = {name: {} for name in _GAUGES}
    durations: dict[str, list[float]] = {}
    causes: dict[tuple[str, str], float] = {}  # (cause, where the state came from) → the restart
    worlds: dict[str, int] = {}
    resizes: dict[str, LastResize] = {}
    rounds: dict[int, LastResize] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                rank = sample.labels.get(contract.RANK_LABEL, "")
                if sample.name in gauges:
                    gauges[sample.name][rank] = sample.value
                elif sample.name in (_DURATION_SUM, _DURATION_COUNT):
                    durations.setdefault(rank, [0.0, 0.0])[sample.name == _DURATION_COUNT] = sample.value
                elif sample.name == contract.counter_sample(contract.STEPS):
                    steps[rank] = sample.value
                elif sample.name == contract.counter_sample(contract.SAMPLES):
                    samples[rank] = sample.value
                elif sample.name == contract.LAST_RESTART_INFO:
                    restart = (
                        sample.labels.get("cause", ""),
                        sample.labels.get(contract.RESTART_FROM_LABEL, contract.RESTART_FROM_CHECKPOINT),
                    )
                    causes[restart] = max(causes.get(restart, 0.0), sample.value)
                elif sample.name == contract.INFO and sample.value == 1:
                    if (world := _count(sample.labels.get("world_size"))) is not None:
                        worlds[rank] = world
                elif sample.name == contract.RESIZE_INFO:
                    if (change := _change(sample.labels, sample.value)) is not None:
                        if rank not in resizes or (change.round, change.at) > (
                            resizes[rank].round,
                            resizes[rank].at,
                        ):
                            resizes[rank] = change
                        if change.round >= 0:
                            rounds[change.round] = _earliest(rounds.get(change.round), change)
                elif sample.name == contract.LOSS:
                    losses[rank] = sample.value
                elif sample.name == contract.counter_sample(contract.SYNC_CHECKS):
                    key = (rank, sample.labels.get("kind", ""), sample.labels.get("result", ""))
                    checks[key] = sample.value
    last_resize = _last_resize(
        resizes,
        gauges[contract.ELASTIC_RESIZES],
        gauges[contract.LAST_RESIZE_SECONDS_LOST],
        (gauges[contract.LAST_RESIZE_STEPS_LOST], gauges[contract.LAST_RESIZE_BYTES_SENT]),
    )
    world_size = _rank0({rank: float(size) for rank, size in worlds.items()})
    by_result = _sum_by_result(checks)
    step = _rank0(gauges[contract.STEP])  # the optimizer step, resumed ones included
    loss = losses.get("0", next(iter(losses.values()), None))
    last_ok = _rank0(gauges[contract.SYNC_LAST_CHECK_OK])
    check_step = _rank0(gauges[contract.SYNC_LAST_CHECK_STEP])
    checks_seen = bool(checks) and sum(checks.values()) > 0
    return Progress(
        step=int(step) if step is not None else (int(min(steps.values())) if steps else 0),
        samples=sum(samples.values()),
        loss=loss if loss is not None and math.isfinite(loss) else None,
        # Every rank takes part in every check: count rank 0's, or any one rank's when 0 is not shown.
        checks_ok=int(by_result.get(contract.CHECK_RESULT_OK, 0)),
        checks_mismatch=int(by_result.get(contract.CHECK_RESULT_MISMATCH, 0)),
        ranks=len(steps),
        step_times={rank: (total, count) for rank, (total, count) in durations.items()},
        skew=_finite(max(gauges[contract.STEP_TIME_SKEW].values(), default=None)),
        last_check_time=_time(max(gauges[contract.SYNC_LAST_CHECK_TIMESTAMP].values(), default=None)),
        last_check_ok=bool(last_ok) if last_ok is not None and checks_seen else None,
        last_check_step=int(check_step) if check_step is not None and checks_seen else None,
        repairs=int(_rank0(gauges[contract.counter_sample(contract.SYNC_REPAIRS)]) or 0),
        mismatched_tensors=int(_finite(_rank0(gauges[contract.SYNC_MISMATCHED_TENSORS])) or 0),
        max_abs_diff=_finite(_rank0(gauges[contract.SYNC_MAX_ABS_DIVERGENCE])),
        nonfinite_steps=int(_rank0(gauges[contract.counter_sample(contract.NONFINITE_LOSS_STEPS)]) or 0),
        total_steps=int(_finite(_rank0(gauges[contract.TOTAL_STEPS])) or 0) or None,
        restarts_in_place=(restarts := int(max(gauges[contract.RESTARTS_IN_PLACE].values(), default=0))),
        world_size=int(world_size) if world_size is not None else None,
        resizes=int(max(gauges[contract.ELASTIC_RESIZES].values(), default=0)),
        last_resize=last_resize,
        changes=tuple(rounds[number] for number in sorted(rounds)),
        restart_cause=(last := _last_restart(causes, restarts))[0],
        restart_from=last[1],
    )


def _last_restart(causes: Mapping[tuple[str, str], float], restarts: int) -> tuple[str, str]:
    """Of the pods' (cause, where the state came from) of restart ``restarts``, the one whose cause names
    the failing rank best (``contract.blame``); nothing said: no cause, the checkpoint."""
    return min(
        (key for key, value in causes.items() if restarts and int(value) == restarts),
        key=lambda key: contract.blame(key[0]),
        default=("", contract.RESTART_FROM_CHECKPOINT),
    )


# Series read as one value per rank (rank 0's wins where one value is wanted).
_GAUGES = (
    contract.STEP,
    contract.STEP_TIME_SKEW,
    contract.SYNC_LAST_CHECK_TIMESTAMP,
    contract.SYNC_LAST_CHECK_OK,
    contract.SYNC_LAST_CHECK_STEP,
    contract.SYNC_MISMATCHED_TENSORS,
    contract.SYNC_MAX_ABS_DIVERGENCE,
    contract.counter_sample(contract.SYNC_REPAIRS),
    contract.counter_sample(contract.NONFINITE_LOSS_STEPS),
    contract.TOTAL_STEPS,
    contract.RESTARTS_IN_PLACE,
    contract.ELASTIC_RESIZES,
    contract.LAST_RESIZE_SECONDS_LOST,
    contract.LAST_RESIZE_STEPS_LOST,
    contract.LAST_RESIZE_BYTES_SENT,
)
_DURATION_SUM = contract.STEP_DURATION + "_sum"
_DURATION_COUNT = contract.STEP_DURATION + "_count"


def _rank0(values: Mapping[str, float]) -> float | None:
    """Rank 0's value, or the lowest rank's when rank 0 is not shown (its pod did not answer)."""
    if not values:
        return None
    return values.get("0", values[min(values, key=lambda r: (_rank_number(r) < 0, _rank_number(r)))])


def _count(text: str | None) -> int | None:
    """A label's whole number (``"3"``), or None."""
    try:
        return int(text or "")
    except ValueError:
        return None


def _change(labels: Mapping[str, str], at: float) -> LastResize | None:
    """One ``ddp_resize_info`` series as a change; None where its labels are not whole numbers."""
    before, after = _count(labels.get("from_nodes")), _count(labels.get("to_nodes"))
    if before is None or after is None:
        return None
    number = _count(labels.get("round"))
    mode = labels.get("mode", contract.RESIZE_RESTARTED)
    reason = labels.get("reason", "")
    return LastResize(reason, before, after, at, None, -1 if number is None else number, mode)


def _earliest(known: LastResize | None, change: LastResize) -> LastResize:
    """One round as two pods say it: the earlier stop (each pod's launcher saw it at its own moment);
    restarted where either pod says so (a pod whose heal failed restarted its workers, and the world with
    them)."""
    if known is None:
        return change
    first = change if change.at < known.at else known
    restarted = contract.RESIZE_RESTARTED in (known.mode, change.mode)
    return dataclasses.replace(first, mode=contract.RESIZE_RESTARTED) if restarted else first


def _last_resize(
    changes: Mapping[str, LastResize],
    counts: Mapping[str, float],
    lost: Mapping[str, float],
    healed: tuple[Mapping[str, float], Mapping[str, float]] = ({}, {}),
) -> LastResize | None:
    """The last world change: the highest round any rank says, and among equals as the rank whose
    launcher counted the most says it (rank 0 among equals): a pod that joined late saw fewer. A healed
    one with what its heal cost that rank (``healed``: steps lost, bytes sent, by rank)."""
    if not changes:
        return None
    rank = max(changes, key=lambda r: (changes[r].round, counts.get(r, 0.0), r == "0", -_rank_number(r)))
    change = dataclasses.replace(changes[rank], seconds_lost=_finite(lost.get(rank)))
    steps, sent = (_finite(values.get(rank)) for values in healed)
    if change.mode != contract.RESIZE_HEALED or steps is None or sent is None:
        return change
    return dataclasses.replace(change, steps_lost=int(steps), bytes_sent=int(sent))


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _time(value: float | None) -> float | None:
    """A Unix time; 0 (a gauge initialised but never set) is none."""
    return value if value is not None and math.isfinite(value) and value > 0 else None


def _sum_by_result(checks: Mapping[tuple[str, str, str], float]) -> dict[str, float]:
    """Checks of every kind by result, as one rank saw them (rank 0 when it is shown)."""
    ranks = sorted({rank for rank, _, _ in checks}, key=lambda r: (r != "0", r))
    if not ranks:
        return {}
    chosen = ranks[0]
    out: dict[str, float] = {}
    for (rank, _, result), value in checks.items():
        if rank == chosen:
            out[result] = out.get(result, 0.0) + value
    return out


def duration(seconds: float) -> str:
    """``1h02m``, ``3m20s``, ``45s``: what a column (and the ETA of the progress line) has room for."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def line(progress: Progress, total_steps: int, elapsed: float, first: Progress | None = None) -> str:
    """One line: step/total, loss, samples/s since the first reading, ETA at the step rate since then,
    and the sync checks so far. ``total_steps`` is the spec's: the code's own total wins where it says.
    What is not known is left out, never shown as a placeholder: the loss of code that does not say it,
    the rate of code that counts no samples (the no-code hook), the rate and ETA before a second reading."""
    total_steps = progress.total(total_steps)
    percent = 100.0 * progress.step / total_steps if total_steps else 0.0
    samples = progress.samples - (first.samples if first else 0.0)
    steps = progress.step - (first.step if first else 0)
    parts = [
        f"step {progress.step}/{total_steps} ({percent:.0f}%)" if total_steps else f"step {progress.step}"
    ]
    if progress.loss is not None:
        parts.append(f"loss {progress.loss:.4f}")
    if elapsed > 0.5 and samples > 0:
        parts.append(f"{samples / elapsed:,.0f} samples/s")
    if steps > 0 and elapsed > 0.5 and total_steps:
        parts.append(f"ETA {duration((total_steps - progress.step) * elapsed / steps)}")
    checks = f"{progress.checks_ok} ok"
    if progress.checks_mismatch:
        checks += f", {progress.checks_mismatch} MISMATCH"
    return "  ".join([*parts, f"sync checks: {checks}"])
