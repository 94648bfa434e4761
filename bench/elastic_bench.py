"""A lost node on an elastic job, side by side in one run on the same job (``ddpjob local``): against a rigid
job (``--mode rigid``, the default), or a silent loss against a process death (``--mode silent``).

    python bench/elastic_bench.py [--nodes 3] [--steps 400] [--kill-after-step 40]
    python bench/elastic_bench.py --mode silent [--rounds 5] [--release-after 30] [--steps 400] ...
    python bench/elastic_bench.py --mode heal [--rounds 5] [--steps 400] ...

The same DDPJob (``--nodes`` pods × 1 process on the CPU, the built-in trainer, a checkpoint every 5
steps) runs several times; in each, once rank 0 has passed ``--kill-after-step``, pod 1 is lost:

* ``--mode rigid``, one run of each, elastic (``spec.elastic: {minNodes: 1, maxNodes: nodes}``) then rigid,
  every process of pod 1 SIGKILLed, as a lost node:

  * elastic: the others re-rendezvous at the smaller world through the store no pod hosts; ten seconds
    later the replacement pod joins and the world grows back;
  * rigid: the attempt fails and the gang restarts as attempt 2 (new pods), as today.

* ``--mode silent``, elastic both times, in ``--rounds`` paired rounds (``bench/paired.py``: ABBA order,
  death = A, silent = B, no warm-up run):

  * death: every process of pod 1 SIGKILLed, as above: its sockets close, the survivors' collectives fail
    at once and the store drops its agent;
  * silent: every process of pod 1 frozen with SIGSTOP, as a node whose power, kernel or network is gone:
    its sockets stay open, so no collective fails, and the survivors' agents must see its rendezvous
    keep-alive stop (``ddp_trainer.launch.silence``: the bound is 5 s) before they re-form without it.
    Once the smaller world's first step is in rank 0's log (or ``--release-after`` seconds after the
    freeze, whichever comes first), the frozen processes are SIGKILLed: ``ddpjob local`` then replaces
    the pod as after a death, the world grows back, and the run ends as the death's does. (SIGCONT would
    do as well, a woken pod rejoins by itself, but a kill makes both sides end by the same path.)

* ``--mode heal``, elastic both times, every process of pod 1 SIGKILLed, in ``--rounds`` paired rounds
  (ABBA, restart = A, heal = B, no warm-up run):

  * restart: the path before heals (``DDPJOB_HEAL=0`` in the job's env, as in every other mode): the
    survivors' launchers stop their workers and start new ones in the smaller world, which restore the last
    checkpoint;
  * heal: the same job as it runs by default, the built-in trainer's elastic job on gloo healing in place
    (docs/trainer.md): the survivors'
    workers keep their processes and state, re-form their group at the smaller world, verify it and step
    on. Its first step is taken just after rank 0's ``verified at step S, before its first step (healed in
    place: K step(s) lost, ...)`` line: the shrink is measured to it and its steps lost are K, the trainer's
    own count (rank 0's step at the loss, scraped up to 0.2 s before the kill, can lag it by steps: a
    restart's steps lost can read negative for it). The grow back heals too: the launchers ask their
    workers to leave their group at the next step boundary, and the joiner takes its state from a survivor.

Measured from the trainer's own log timestamps (rank 0's "first optimizer step of this run" lines, which
each new world writes) and the loss's own clock (the kill's, or the freeze's):

* shrink (elastic) and recovery (rigid): seconds from the loss to the first step after it; steps lost: the
  step rank 0 had reached at the loss (its ``ddp_step`` metric) less the step it resumed from;
* grow (elastic): seconds of training lost to the replacement joining: from the running world's stop
  (its first SIGTERM line, any rank's; for a heal, the first launcher's request, :data:`GROW_ASKED`) to the
  grown world's first step; steps lost the same way (a healed grow's: its line's count).

Goals on the 2-core machine: (issue 42) shrink <= 0.5 of the rigid recovery, a grow loses <= 15 s;
(issue 54) a silent loss <= 15 s from the freeze to the first step at the smaller world (a death's shrink,
4.5 s, plus the keep-alive bound). ``--mode silent`` prints each side's shrink and steps lost with their
spread (median [min-max] over the rounds), the silent/death ratio of each round with its spread
(``paired.judge``, no goal), and the 15 s goal's verdict over every round's silent shrink (``paired.verdict``:
met only if every round clears it); ``--mode heal`` the same for restart and heal, the heal/restart ratio
against issue 57's goal (<= 0.5, the whole spread below it), its steps lost against <= 1 per loss, and
its healed grows' steps lost against 0 with their pause. Fewer
than ``paired.MIN_ROUNDS`` rounds are allowed (each sample is a
whole job, minutes on 2 cores) and said so beside the figures. Prints figures, never asserts.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import paired
import yaml

REPO = Path(__file__).resolve().parents[1]
# the packages from this checkout, and tests/helpers: a pod's processes are found as the tests find them
sys.path[:0] = [str(REPO / "operator"), str(REPO / "trainer_image"), str(REPO / "tests")]

from helpers.local_jobs import signal_pod  # noqa: E402

FIRST_STEP = re.compile(
    r"^(\S+ \S+) \[rank 0\] INFO first optimizer step of this run: step (\d+)(?: \(resumed from (\d+)\))?"
)
SIGTERM = re.compile(r"^(\S+ \S+) \[rank \d+\] WARNING received SIGTERM")
"""Any rank's: a world's stop for a grow reaches rank 0 through the step-boundary agreement, which it does not
always log as a signal of its own."""
GROW_ASKED = re.compile(r"^(\S+ \S+) \[launcher\] a node waits to join the world")
"""A launcher that heals, asking its workers to leave their group at the next step boundary for a joiner:
where a healed grow's pause begins (a restart's begins at its SIGTERM)."""
HEALED = re.compile(
    r"^(\S+ \S+) \[rank 0\] (?:INFO )?elastic: world size \d+ verified at step (\d+), before its first step "
    r"\(healed in place: (\d+) step"
)
"""Rank 0's line of a world healed in place, just before that world's "first optimizer step of this run"
(resumed from the step it names)."""
STEP = re.compile(r"^(\S+ \S+) \[rank 0\] INFO step (\d+):")
METRICS = re.compile(r"metrics (\S+) :(\d+)")
SILENT_GOAL_S = 15.0
"""Issue 54: from the freeze to the first step at the smaller world."""
HEAL_GOAL_RATIO = 0.5
"""Issue 57: a heal's shrink at most half of the restart's, round by round."""
HEAL_GOAL_STEPS = 1
"""Issue 57: steps lost per loss by a heal."""
HEAL_GOAL_GROW_STEPS = 0
"""Issue 57: steps lost per grow by a heal."""


def _when(stamp: str) -> float:
    return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _doc(name: str, nodes: int, steps: int, elastic: bool, heal: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodes": nodes,
        "procsPerNode": 1,
        "device": "cpu",
        "trainer": {"steps": steps, "batchSize": 16, "checkpointEvery": 5},
        "syncCheck": {"everySteps": 20},
        "checkpoint": {"volumeClaimTemplate": {"size": "1Gi"}},
    }
    if elastic:
        spec["elastic"] = {"minNodes": 1, "maxNodes": nodes}
    if not heal:  # the built-in trainer's elastic job heals by default: the restart path, asked for
        spec["env"] = [{"name": "DDPJOB_HEAL", "value": "0"}]
    return {"apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob", "metadata": {"name": name}, "spec": spec}


def _rank0_step(port: int) -> int:
    from ddp_operator.observe import metrics

    text = metrics.scrape(port)
    return metrics.parse([text]).step if text else -1


def _log_lines(folder: Path, name: str) -> list[str]:
    return [
        line
        for log in sorted((folder / "runs" / name).glob("attempt-*/*.log"))
        for line in log.read_text(errors="replace").splitlines()
    ]


def figures_from(lines: Sequence[str], lost_at: float, reached: int, elastic: bool) -> dict[str, Any]:
    """The figures of one run from its log lines (every pod's, every attempt's), the loss's clock
    (``time.time()``) and the step rank 0 had reached at the loss: ``recover_s``/``recover_steps`` (the
    loss to the first step after it) and, elastic, ``grow_s``/``grow_steps`` (the running world's first
    SIGTERM, any rank's, or a healing launcher's request (:data:`GROW_ASKED`), to the next world's first
    step); a figure the logs do not hold is absent. A world healed in place (its :data:`HEALED` line, then
    the first step after the step it names) loses the steps it says it lost (``healed``, and for the grow
    ``grow_healed``)."""
    healed = {int(m[2]): int(m[3]) for line in lines if (m := HEALED.match(line))}  # resumed after → lost
    starts = [(_when(m[1]), int(m[3] or 0)) for line in lines if (m := FIRST_STEP.match(line))]
    firsts = [(at, resumed, healed.get(resumed)) for at, resumed in sorted(starts)]
    terms = sorted(_when(m[1]) for line in lines if (m := SIGTERM.match(line) or GROW_ASKED.match(line)))
    after = [f for f in firsts if f[0] > lost_at]
    figures: dict[str, Any] = {"reached": reached}
    if after:
        at, resumed, lost = after[0]
        figures.update(recover_s=at - lost_at, recover_steps=reached - resumed if lost is None else lost)
        if lost is not None:
            figures["healed"] = True
    if elastic and len(after) > 1:
        at, resumed, lost = after[1]
        stop = min((t for t in terms if after[0][0] < t < at), default=None)
        if stop is not None:
            steps = max(0, _step_before(lines, stop) - resumed) if lost is None else lost
            figures.update(grow_s=at - stop, grow_steps=steps)
            if lost is not None:
                figures["grow_healed"] = True
    return figures


def _step_before(lines: Sequence[str], when: float) -> int:
    """The last step rank 0 logged (a check or a checkpoint) before ``when``."""
    best = 0
    for line in lines:
        m = STEP.match(line)
        if m and _when(m[1]) <= when:
            best = max(best, int(m[2]))
    return best


def run(
    folder: Path,
    name: str,
    nodes: int,
    steps: int,
    kill_after: int,
    elastic: bool,
    *,
    silent: bool = False,
    release_after: float = 30.0,
    heal: bool = False,
) -> dict[str, Any]:
    """One job; pod 1 lost once rank 0 passed ``kill_after``: SIGKILLed, or (``silent``) frozen, then
    SIGKILLed at the smaller world's first step or ``release_after`` seconds after the freeze. ``heal``: the
    job heals in place (its default); else it restarts (``DDPJOB_HEAL=0``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.yaml").write_text(yaml.safe_dump(_doc(name, nodes, steps, elastic, heal)))
    argv = [sys.executable, "-m", "ddp_operator", "local", "job.yaml", "--workdir", "runs"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO / "trainer_image")])}
    out_path = folder / "out.log"
    frozen: list[int] = []
    extra: dict[str, Any] = {}
    with open(out_path, "w") as out:
        process = subprocess.Popen(argv, cwd=folder, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            port = None
            reached = -1
            while reached < kill_after:
                assert process.poll() is None, out_path.read_text()
                if port is None and (m := METRICS.search(out_path.read_text())):
                    port = int(m.group(2))
                reached = _rank0_step(port) if port else -1
                time.sleep(0.2)
            lost_at = time.time()
            if not silent:
                signal_pod(name, 1, signal.SIGKILL)
            else:
                frozen = signal_pod(name, 1, signal.SIGSTOP)
                while time.time() - lost_at < release_after and process.poll() is None:
                    if "recover_s" in figures_from(_log_lines(folder, name), lost_at, reached, elastic):
                        break
                    time.sleep(0.5)
                extra["released_s"] = time.time() - lost_at
                for pid in frozen:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            process.wait(timeout=900)
        finally:
            for pid in frozen:  # whatever a failed run left of them
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if process.poll() is None:
                process.kill()
                process.wait()
    figures = figures_from(_log_lines(folder, name), lost_at, reached, elastic)
    return {"code": process.returncode, **figures, **extra}


def spread_said(values: Sequence[float], unit: str = "s", digits: int = 1) -> str:
    """``4.5 s [4.3-4.9]``: the median and the min-max of ``values``."""
    if not values:
        return "—"
    f = f"{{:.{digits}f}}"
    middle, low, high = paired.spread(values)
    return f"{f.format(middle)} {unit} [{f.format(low)}-{f.format(high)}]"


def silent_report(death: Sequence[dict[str, Any]], silent: Sequence[dict[str, Any]]) -> list[str]:
    """The lines ``--mode silent`` prints after its rounds (:func:`paired_report`, death = A, silent = B):
    the ratio silent/death without a goal, and issue 54's 15 s over every round's silent shrink."""
    lines, whole = paired_report(("death", "silent"), death, silent, ratio_goal=None)
    if whole:
        b = [pair[1]["recover_s"] for pair in whole]
        goal = paired.verdict(min(b), max(b), SILENT_GOAL_S, "at most")
        lines.append(f"silent <= {SILENT_GOAL_S:.0f} s in every round: {goal} (max {max(b):.1f} s)")
    return lines


def heal_report(restart: Sequence[dict[str, Any]], heal: Sequence[dict[str, Any]]) -> list[str]:
    """The lines ``--mode heal`` prints after its rounds (:func:`paired_report`, restart = A, heal = B): the
    ratio heal/restart against issue 57's 0.5, and the heal's steps lost against 1 per loss, over every round;
    a heal round that restarted instead (no healed world) is said."""
    lines, whole = paired_report(("restart", "heal"), restart, heal, ratio_goal=HEAL_GOAL_RATIO)
    if whole:
        unhealed = sum(1 for pair in whole if not pair[1].get("healed"))
        if unhealed:
            lines.append(
                f"  {unhealed} heal round(s) restarted instead of healing: their figures are a restart's"
            )
        lost = [pair[1]["recover_steps"] for pair in whole]
        goal = paired.verdict(min(lost), max(lost), HEAL_GOAL_STEPS, "at most")
        lines.append(
            f"heal steps lost <= {HEAL_GOAL_STEPS} per loss in every round: {goal} (max {max(lost)})"
        )
        grows = [pair[1] for pair in whole if pair[1].get("grow_healed")]
        if grows:
            lost = [g["grow_steps"] for g in grows]
            goal = paired.verdict(min(lost), max(lost), HEAL_GOAL_GROW_STEPS, "at most")
            pause = spread_said([g["grow_s"] for g in grows])
            lines.append(
                f"heal steps lost <= {HEAL_GOAL_GROW_STEPS} per grow in every healed grow ({len(grows)} of "
                f"{len(whole)}): {goal} (max {max(lost)}); its pause {pause}"
            )
    return lines


def paired_report(
    names: tuple[str, str],
    a_side: Sequence[dict[str, Any]],
    b_side: Sequence[dict[str, Any]],
    ratio_goal: float | None,
) -> tuple[list[str], list[tuple[dict[str, Any], dict[str, Any]]]]:
    """The lines after paired rounds (``names``: A's and B's, round by round): per round, then each side's
    spread and the ratio B/A (against ``ratio_goal``, at most); and the complete rounds. Rounds where either
    side has no shrink figure are shown and left out of the spreads."""
    lines = []
    for number, (order, a, b) in enumerate(zip(paired.abba(len(a_side)), a_side, b_side, strict=True), 1):
        lines.append(f"  round {number} ({' '.join(names[0] if s == 'A' else names[1] for s in order)}):")
        for side, got in zip(names, (a, b), strict=True):
            lines.append(f"    {side:7}: {got}")
    whole = [(a, b) for a, b in zip(a_side, b_side, strict=True) if "recover_s" in a and "recover_s" in b]
    if len(whole) < len(a_side):
        lines.append(f"  {len(a_side) - len(whole)} round(s) without a shrink figure on a side: left out")
    if not whole:
        lines.append("no complete round: no figure")
        return lines, whole
    width = max(len(n) for n in names)
    for side, index in zip(names, (0, 1), strict=True):
        got = [pair[index] for pair in whole]
        grows = [g["grow_s"] for g in got if "grow_s" in g]
        lines.append(
            f"{side:{width}} loss → first step at the smaller world: "
            f"{spread_said([g['recover_s'] for g in got])}, "
            f"steps lost {spread_said([g['recover_steps'] for g in got], 'steps', 0)}; "
            f"grow {spread_said(grows)} ({len(grows)} of {len(got)})"
        )
    a, b = [p[0]["recover_s"] for p in whole], [p[1]["recover_s"] for p in whole]
    ratio = paired.judge(a, b, over="b/a", goal=ratio_goal, direction="at most")
    few = (
        f" (fewer than {paired.MIN_ROUNDS} rounds: a rough spread)"
        if ratio.rounds < paired.MIN_ROUNDS
        else ""
    )
    lines.append(f"ratio {names[1]}/{names[0]}: {ratio.said(2)}{few}")
    return lines, whole


def rigid_mode(args: argparse.Namespace, where: Path) -> None:
    elastic = run(where / "e", "bench-e", args.nodes, args.steps, args.kill_after_step, True)
    rigid = run(where / "r", "bench-r", args.nodes, args.steps, args.kill_after_step, False)
    print(f"{args.nodes} pods x 1 process (cpu/gloo), pod 1 SIGKILLed after step {args.kill_after_step}")
    print(f"  elastic: exit {elastic['code']}, {elastic}")
    print(f"  rigid:   exit {rigid['code']}, {rigid}")
    if "recover_s" in elastic and "recover_s" in rigid:
        ratio = elastic["recover_s"] / rigid["recover_s"]
        print(
            f"shrink {elastic['recover_s']:.1f} s ({elastic['recover_steps']} steps lost) vs rigid recovery "
            f"{rigid['recover_s']:.1f} s ({rigid['recover_steps']} steps lost): ratio {ratio:.2f} "
            "(goal <= 0.5)"
        )
    if "grow_s" in elastic:
        print(
            f"grow: {elastic['grow_s']:.1f} s of training lost, {elastic['grow_steps']} steps (goal <= 15 s)"
        )


def rounds(
    args: argparse.Namespace, where: Path, kinds: str, **b_side: Any
) -> dict[str, list[dict[str, Any]]]:
    """``args.rounds`` paired rounds (ABBA) of the elastic job, A's runs named by ``kinds[0]``, B's by
    ``kinds[1]`` with ``b_side`` given to :func:`run`; each side's figures, round by round."""
    got: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    for number, order in enumerate(paired.abba(args.rounds), 1):
        for side in order:
            kind = kinds[0] if side == "A" else kinds[1]
            more = b_side if side == "B" else {}
            got[side].append(
                run(
                    where / f"{kind}{number}",
                    f"bench-{kind}{number}",
                    args.nodes,
                    args.steps,
                    args.kill_after_step,
                    True,
                    release_after=args.release_after,
                    **more,
                )
            )
    return got


def heal_mode(args: argparse.Namespace, where: Path) -> None:
    got = rounds(args, where, "rh", heal=True)
    print(
        f"{args.nodes} pods x 1 process (cpu/gloo), elastic (minNodes 1), pod 1 SIGKILLed after step "
        f"{args.kill_after_step}: restart (DDPJOB_HEAL=0) vs heal in place (the default); {args.rounds} "
        "paired rounds (ABBA, restart = A)"
    )
    print("\n".join(heal_report(got["A"], got["B"])))


def silent_mode(args: argparse.Namespace, where: Path) -> None:
    got = rounds(args, where, "ds", silent=True)
    print(
        f"{args.nodes} pods x 1 process (cpu/gloo), elastic (minNodes 1), pod 1 lost after step "
        f"{args.kill_after_step}: SIGKILL (death) vs SIGSTOP (silent; SIGKILLed at the smaller world's first "
        f"step or {args.release_after:.0f} s); {args.rounds} paired rounds (ABBA, death = A)"
    )
    print("\n".join(silent_report(got["A"], got["B"])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument(
        "--mode",
        choices=("rigid", "silent", "heal"),
        default="rigid",
        help="elastic vs rigid, silent vs death, or heal vs restart",
    )
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--kill-after-step", type=int, default=40)
    parser.add_argument(
        "--rounds", type=int, default=paired.MIN_ROUNDS, help="--mode silent or heal: paired rounds"
    )
    parser.add_argument(
        "--release-after",
        type=float,
        default=30.0,
        help="--mode silent: SIGKILL the frozen pod this long after the freeze at the latest (s)",
    )
    parser.add_argument(
        "--keep", type=Path, help="run in this folder and keep its logs (default: a temp one)"
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds: at least 1")
    with tempfile.TemporaryDirectory(prefix="elastic-bench-") as tmp:
        where = args.keep or Path(tmp)
        {"rigid": rigid_mode, "silent": silent_mode, "heal": heal_mode}[args.mode](args, where)


if __name__ == "__main__":
    main()
