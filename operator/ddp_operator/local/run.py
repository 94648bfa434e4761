"""The I/O edge of ``ddpjob local``: start the pods of each attempt, watch them, report, restart or stop.

Everything it decides comes from pure functions: ``processes.local_pods`` (what runs),
``restarts.decide`` (what happens after an attempt) and ``observe.metrics`` (what a person sees).
Long because it is local mode's one loop: start, watch, report, restart (in place or as a new attempt) or
stop, and the sync hook's init container.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from ddp_operator.api import exits
from ddp_operator.api.spec import Spec, known_total_steps
from ddp_operator.children import render
from ddp_operator.decide import ending, restarts
from ddp_operator.local import elastic, gang, host, notes, processes
from ddp_operator.local.console import Console, Interrupt
from ddp_operator.observe import failures, metrics, podlogs, sync_report
from ddp_trainer import contract

GRACE_SECONDS = 30.0  # the trainer checkpoints at its next step boundary on SIGTERM, well within this
POLL_SECONDS = 0.2
PROGRESS_SECONDS = 1.0

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_INTERRUPTED = 0, 1, 2, 130


def run(
    spec: Spec,
    *,
    workdir: Path,
    verbose: bool = False,
    fresh: bool = False,
    stream: TextIO | None = None,
    job_dir: Path | None = None,
    pod_security: str | None = None,
) -> int:
    """Run the DDPJob here until it succeeds, fails for good, or is interrupted; returns the exit code.
    ``job_dir``: the DDPJob file's directory, where a script the command names is looked for after the
    current directory (:mod:`ddp_operator.local.scripts`). ``pod_security``: the Pod Security level whose
    refusals in a cluster are said at the start, as ``ddpjob validate --pod-security`` says them."""
    console = Console(stream or sys.stdout, verbose)  # sys.stdout as it is now (a test may have replaced it)
    processes.check_devices(spec, host.visible_gpus() if spec.device == "cuda" else 0)
    # absolute: each pod runs in a folder of its own, so every path handed to it must be
    run_dir = workdir.absolute() / spec.name
    note = host.prepare_run_dir(run_dir, fresh=fresh)
    first_attempt = host.next_attempt(run_dir)
    console.say(
        f"ddpjob local: {spec.name}: {spec.nodes} pods × {spec.procs_per_node} processes = "
        f"{spec.world_size} ranks ({spec.device}/{spec.backend}) in {run_dir}"
    )
    console.say(f"  the image {spec.image} is not pulled: pods run in this Python environment ({sys.prefix})")
    for line in [note, *notes.local_notes(spec, first_attempt, run_dir, pod_security)]:
        if line:
            console.say(f"  {line}")
    started = time.monotonic()
    attempt = first_attempt
    earlier = first_attempt - contract.FIRST_ATTEMPT
    in_place = 0  # gang restarts done in place (same pods), as the pods' reports say
    # the sync checks of every attempt (an earlier, unfinished run's too: its reports stay in its folders)
    checked = sync_report.with_attempt([], None)
    for earlier_attempt in range(contract.FIRST_ATTEMPT, first_attempt):
        checked = sync_report.with_attempt(checked, _checks_of(run_dir, earlier_attempt))
    with Interrupt() as interrupt:
        while True:
            used = restarts.restarts_used(attempt, earlier, in_place)
            outcome = _attempt(spec, attempt, run_dir, console, interrupt, used, job_dir)
            checked = sync_report.with_attempt(checked, _checks_of(run_dir, attempt))
            now_in_place = _in_place(outcome.report, attempt)
            if now_in_place:
                in_place += now_in_place
                said = outcome.report or {}
                console.say(
                    f"ddpjob local: {spec.name}: attempt {attempt} restarted its gang in place "
                    f"{now_in_place} time(s) in the same pods (last: "
                    f"{said.get(contract.REPORT_LAST_RESTART, 'a process failed')}; "
                    f"{restarts.resuming_from(said.get(contract.REPORT_LAST_RESTART_FROM))})"
                )
            if interrupt.count:
                host.write_state(run_dir, "Interrupted")
                console.say(
                    f"ddpjob local: {spec.name}: interrupted during attempt {attempt}; every pod stopped. "
                    f"Run the same command again to resume from {run_dir / 'volumes'}"
                )
                return EXIT_INTERRUPTED
            # an earlier, interrupted run's attempts count like preemptions: not against maxRestarts
            decision = restarts.decide(outcome, attempt, spec.max_restarts, earlier, in_place)
            if decision.action is restarts.Action.RESTART:
                console.say(f"ddpjob local: {spec.name}: {decision.message}")
                attempt += 1
                continue
            succeeded = decision.action is restarts.Action.SUCCEED
            host.write_state(run_dir, "Succeeded" if succeeded else "Failed")
            attempts = attempt - first_attempt + 1
            _summary(console, spec, run_dir, attempts, decision, outcome, time.monotonic() - started, checked)
            if spec.elastic is not None:
                healed: elastic.Healed = {}
                found = elastic.worlds(sorted(run_dir.glob("attempt-*/*.log")), healed)
                console.say("  " + elastic.summary(found, healed))
            return EXIT_OK if succeeded else EXIT_FAILED


def _checks_of(run_dir: Path, attempt: int) -> dict[str, int] | None:
    """The sync checks of ``attempt``, every world of it, as its pods' reports tell (the one that tells the
    most: a pod killed before it reported, or one that joined late, tells less)."""
    found = [
        sync_report.attempt_checks(contract.parse_report(_read(path)), attempt)
        for path in sorted((run_dir / f"attempt-{attempt}").glob("*.termination-log"))
    ]
    return max((f for f in found if f), key=lambda f: (f["checks"], f["worlds"]), default=None)


def _in_place(report: Mapping[str, Any] | None, attempt: int) -> int:
    """The gang restarts done in place during ``attempt``, as rank 0's report says."""
    said = (report or {}).get(contract.REPORT_RESTARTS_IN_PLACE)
    return said if (report or {}).get("attempt") == attempt and isinstance(said, int) and said > 0 else 0


def _attempt(
    spec: Spec,
    attempt: int,
    run_dir: Path,
    console: Console,
    interrupt: Interrupt,
    used: int,
    job_dir: Path | None = None,
) -> restarts.Outcome:
    # a port the system hands out, not spec.masterPort: two local runs at once (two test lanes) both found
    # 29500 free and the second's node 0 could not host its store (EADDRINUSE: an attempt lost)
    master_port = host.free_port()
    metrics_ports = [host.free_port() for _ in range(spec.nodes)]
    gpus = list(range(spec.world_size)) if spec.device == "cuda" else None
    pods = processes.local_pods(
        spec,
        attempt,
        run_dir,
        master_port=master_port,
        metrics_ports=metrics_ports,
        host_env=os.environ,
        gpus=gpus,
        launch_dir=Path.cwd(),
        job_dir=job_dir,
        restarts_used=used,
    )
    marker = gang.new_marker()
    if spec.command is not None or spec.args is not None:  # a custom command's own output, as `kubectl logs`
        console.shown = frozenset([pods[0].name])
    console.say(
        f"attempt {attempt}: rendezvous 127.0.0.1:{master_port}; metrics "
        + ", ".join(f"{p.name} :{p.metrics_port}" for p in pods)
        + f"; logs {pods[0].log_path.parent}"
    )
    members = gang.Gang(marker)
    store = None
    if spec.elastic is not None and render.external_store(spec):  # not when the command runs torchrun itself
        store_log = pods[0].log_path.parent / "rendezvous-store.log"
        gate = Path(os.environ[elastic.GATE_ENV]) if os.environ.get(elastic.GATE_ENV) else None
        store = elastic.KeptStore(
            master_port, {**os.environ, gang.MARKER: marker}, store_log, console.say, gate=gate
        )
        kept = store
        members.spared = lambda: (kept.process.pid,)  # stopped after the pods, by store.stop()
        console.say(
            f"attempt {attempt}: elastic ({spec.elastic.min_nodes}-{spec.elastic.max_nodes} nodes): the "
            f"rendezvous store serves :{master_port} in a process of its own, so any pod may leave"
        )
    started: dict[int, gang.Member] = {}
    try:
        for pod in pods:
            for folder in [*pod.volumes, processes.tmp_dir(pod)]:
                folder.mkdir(parents=True, exist_ok=True)
            env = {
                **processes.process_env(pod, os.environ, Path.cwd()),
                gang.MARKER: marker,
            }
            if init_failed := _init(pod, {**processes.init_env(os.environ), gang.MARKER: marker}):
                _abandon(members, store)
                return init_failed
            member = gang.Member(pod.name, pod.argv, env, pod.log_path, console.pod_line, pod.cwd)
            members.start(member)
            started[pod.index] = member
    except FileNotFoundError as exc:
        _abandon(members, store)
        return restarts.Outcome(
            False, reason="InvalidSpec", message=f"the command {exc.filename!r} is not found on this machine"
        )
    except BaseException:  # an interrupt while the pods start: nothing of the attempt is left running
        _abandon(members, store)
        raise

    def respawn(index: int, count: int) -> None:
        """The Job controller's replacement of a failed pod (same index, a log of its own)."""
        pod, old = pods[index], started[index]
        log = pod.log_path.with_name(f"{pod.name}.{count + 1}.log")
        members.replace(index, gang.Member(pod.name, pod.argv, old.env, log, console.pod_line, pod.cwd))

    try:
        first, codes = _watch(spec, pods, members, console, interrupt, respawn)
    finally:
        if store is not None:
            store.stop()
    reports = [contract.parse_report(_read(pod.termination_path)) for pod in pods]
    # an elastic attempt that finished, verified: a pod that left the world and ended after is not its failure
    done = _finished_pod(spec, pods, first)
    report = failures.with_failures(reports[done or 0], reports)  # every pod's failed ranks: who failed first
    failed = [] if done is not None else [(pod, code) for pod, code in zip(pods, first, strict=True) if code]
    for pod, code in failed[:2]:
        error = podlogs.first_error((_read(pod.log_path) or "").splitlines())
        which = "its first error" if error else "its last lines"
        console.say(f"{pod.name} {exits.exited(code)}; {which} (all its output is in {pod.log_path}):")
        for text in error or members.last_lines(pod.index, 12):
            console.say(f"  [{pod.name}] {text}")
    culprits = [f"node {p.index} {exits.exited(code)}" for p, code in failed]
    return restarts.Outcome(
        succeeded=not interrupt.count and (done is not None or all(code == 0 for code in codes)),
        exit_codes={pod.index: code for pod, code in zip(pods, codes, strict=True) if code is not None},
        report=report,
        message=", ".join(culprits),
        # the pods that failed first, on their own (the rest were stopped by the gang: SIGTERM)
        crashed=any(code not in (None, 0, contract.INTERRUPTED_EXIT_CODE) for _, code in failed),
    )


def _init(pod: processes.LocalPod, env: dict[str, str]) -> restarts.Outcome | None:
    """Run the pod's init commands (the sync hook's) to completion, their output in its log; the outcome
    of a failed attempt when one fails (as a pod whose init container fails never starts)."""
    pod.workdir.mkdir(parents=True, exist_ok=True)
    for argv in pod.init:
        with open(pod.log_path, "ab") as log:
            done = subprocess.run(argv, env=env, cwd=pod.workdir, stdout=log, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            return restarts.Outcome(
                False,
                reason="InitContainerFailed",
                message=f"{pod.name}: the sync hook's init container ({' '.join(argv)}) exited "
                f"{done.returncode}; its output is in {pod.log_path}",
            )
    return None


def _abandon(members: gang.Gang, store: elastic.KeptStore | None) -> None:
    """An attempt that ends before its pods all started: kill what started, then stop the store."""
    members.kill()
    if store is not None:
        store.stop()


def _watch(
    spec: Spec,
    pods: list[processes.LocalPod],
    members: gang.Gang,
    console: Console,
    interrupt: Interrupt,
    respawn: Callable[[int, int], None] | None = None,
) -> tuple[list[int | None], list[int | None]]:
    """Wait for all pods to succeed, one to fail, or an interrupt; then make sure none is left.
    Returns the exit codes when that happened (who failed first) and after every pod stopped. An elastic
    job's failed pod is replaced instead (``respawn``) while enough others run (``elastic.replaceable``)."""
    last_progress = first_at = time.monotonic()
    first: metrics.Progress | None = None
    replaced, pending = 0, dict[int, float]()  # pod index -> when its replacement starts
    finished_at: float | None = None  # when a pod's report said the training finished, verified (elastic)
    while True:
        codes = members.codes()
        if finished_at is None and _finished_pod(spec, pods, codes) is not None:
            finished_at, pending = time.monotonic(), {}  # nothing is replaced once the training finished
        if finished_at is not None:  # the last world's peers end within seconds; a pod that left it never
            waited = time.monotonic() - finished_at >= ending.FINISH_WAIT_SECONDS
            if interrupt.count or waited or all(c is not None for c in codes):
                break
            time.sleep(POLL_SECONDS)
            continue
        for index, code in enumerate(codes):
            if index in pending or respawn is None or interrupt.count:
                continue
            if elastic.replaceable(spec, codes, index, replaced + len(pending)):
                running = sum(c is None for c in codes)
                pending[index] = time.monotonic() + elastic.REPLACE_AFTER_SECONDS
                name, wait = pods[index].name, elastic.REPLACE_AFTER_SECONDS
                console.say(
                    f"{name} {exits.exited(code or 0)}: the other {running} pod(s) go on at a smaller world "
                    f"(elastic); a new {name} starts in {wait:.0f} s, as the Job controller replaces a "
                    "failed pod, and rejoins at a step boundary"
                )
        for index, due in list(pending.items()):
            if respawn is not None and time.monotonic() >= due and not interrupt.count:
                respawn(index, replaced)
                replaced += 1
                del pending[index]
        codes = members.codes()
        failed = [code for index, code in enumerate(codes) if code not in (None, 0) and index not in pending]
        if interrupt.count or failed or all(c == 0 for c in codes):
            break
        time.sleep(POLL_SECONDS)
        if time.monotonic() - last_progress >= PROGRESS_SECONDS:
            last_progress = time.monotonic()
            texts = [text for pod in pods if (text := metrics.scrape(pod.metrics_port)) is not None]
            if texts and (now := metrics.parse(texts)).step > 0:
                if first is None:
                    first, first_at = now, time.monotonic()
                console.progress(
                    metrics.line(now, known_total_steps(spec), time.monotonic() - first_at, first), now.step
                )
    ended = [(pod, code) for pod, code in zip(pods, codes, strict=True) if code not in (None, 0)]
    if interrupt.count:
        console.say("interrupted: stopping every pod (SIGTERM; the trainer checkpoints at its next step)")
    elif finished_at is not None and (None in codes or ended):
        left = [pod.name for pod, code in zip(pods, codes, strict=True) if code is None]
        console.say(
            "the training finished, verified; "
            + ", ".join([f"{pod.name} {exits.exited(code or 0)}" for pod, code in ended] + left)
            + (f" (still running {ending.FINISH_WAIT_SECONDS:.0f} s later: stopping it)" if left else "")
            + ": it had left the world (silent, frozen or cut off), so its end is not the attempt's"
        )
    elif ended and None in codes:  # the others are stopped, as the Job controller does
        console.say(
            ", ".join(f"{pod.name} {exits.exited(code or 0)}" for pod, code in ended)
            + ": stopping the other pods (SIGTERM); a traceback they print now is that stop's, not a "
            "failure of their own"
        )
    console.stopping = True
    try:
        members.stop(0.0 if interrupt.count > 1 else GRACE_SECONDS)
    finally:
        console.stopping = False
    return codes, members.codes()


def _finished_pod(spec: Spec, pods: list[processes.LocalPod], codes: list[int | None]) -> int | None:
    """An elastic attempt whose training finished: the pod that exited 0 with a report saying so, verified
    (:func:`ending.finished_pod`), or None."""
    if spec.elastic is None or 0 not in codes:
        return None
    reports = [
        contract.parse_report(_read(pod.termination_path)) if code == 0 else None
        for pod, code in zip(pods, codes, strict=True)
    ]
    warn = spec.sync_check.on_divergence == "Warn"
    return ending.finished_pod(codes, reports, known_total_steps(spec), warn)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _summary(
    console: Console,
    spec: Spec,
    run_dir: Path,
    attempts: int,
    decision: restarts.Decision,
    outcome: restarts.Outcome,
    seconds: float,
    checked: list[dict[str, int]] | None = None,
) -> None:
    result = "Succeeded" if decision.action is restarts.Action.SUCCEED else "Failed"
    console.say(
        f"ddpjob local: {spec.name}: {result} in {seconds:.1f}s after {attempts} attempt(s)"
        + ("" if result == "Succeeded" else f" — {decision.reason}: {decision.message}")
    )
    console.say(f"  sync: {sync_report.sync_sentence(outcome.report, checked)}")
    console.say(f"  checkpoints and logs: {run_dir}")
