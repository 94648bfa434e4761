"""Each feature's home: follow a feature from its entrances to their returns and count the files it opens.

Issue 56 asks that each of six features (an elastic resize, the fingerprint check, a restart in place, the
compute probe, the Kueue reason, checkpoint identity) have its home in at most 8 files, none entered
twice. The figures here are measured, as ``hack/walk.py`` measures one reconcile, never guessed from
imports or names:

- **a feature's entrances** are the functions a reader starts from to read it: each side's own code for
  the feature, called where that side calls it (the launcher's bookkeeping, a ``SyncHealth``'s check, a
  room of ``decide/``). A feature that has a trainer side and an operator side (the trainer does it, the
  operator reads what it said into the status) is followed through each side's entrances in turn, and its
  figures are the union. What the two sides hand each other (the launcher's state file, the metrics
  reading, rank 0's report) is built as they build it; the reading of every metric at once
  (``observe/metrics``) and the report's writing serve every feature and are the reconcile's walk
  (``hack/walk.py``), not a feature's;
- one small scenario per feature calls its entrances in this process on realistic inputs (a one-process
  gloo group for the trainer's collectives, a DDPJob body as ``hack/walk.py`` makes one), once to warm
  the caches and once followed, with ``walk.follow`` (``sys.setprofile``): a *stop* each time the project
  module of the code changes, at a call or a return. Third-party code (torch, prometheus_client) is a
  corridor, not counted: a project function it calls back (a model's ``forward``) is a stop of its own;
- a feature's **files** are the distinct project modules its stops enter: what a reader following it
  opens;
- a module is **entered twice** when a call enters it while it is still open below (the reader left it
  for a module it called, and a call from there, or deeper, sends them back into it before they finished
  it: a callback, a method inherited from a module above, two modules calling each other). A return to
  the caller is not an entrance (the reader finishes the function they were reading), and neither is a
  second call from the same open module into a helper module it already called (a file already read,
  below: what the import layers promise), nor a generator started or resumed by the code that iterates it
  (a value being read: its code is read where it is written, so the frames below it are not its
  reader's path either). These are the cycles import-linter cannot see, because callbacks and
  inheritance make them without an import; the issue's example (``health.py`` ↔ ``verify.py``, later
  ``sync/checking`` ↔ ``sync/verify``, one module since) was such a cycle.

Why this count and not another: it is the path a person takes, not the modules that mention a word (an
earlier count of modules naming the feature caught a Lease's "identity" and mixed the two packages); it
follows each side from where that side begins the feature, so a feature is not charged with the whole
reconcile or the whole training step around it; and its stops are the walk's, from the same profiler
(``hack/walk.py``'s ``module_of`` and ``follow``), so a stop, a module and a corridor mean the same in both;
only "entered twice" is new, and ``follow`` marks it (``again``) from the frames really open, not guessed
from the order of the stops.

**The common ground, and a feature's home.** Some modules are entered by most features: the status's
types and its builder (``api/typed_status``, ``decide/status_builder``), through which every room of the
decision says what it says, and the trainer's metrics exporter (``reporting/metrics``), through which every
trainer side records what it did. They are the house's shared ground, read once for all features (as the
walk reads them once for a reconcile), not any feature's home: charged to each feature, one file would
count six times and hide what a feature owns. So the script computes them, never lists them by hand:

- the **common ground** is the modules entered by at least half of the features (3 of today's 6). Half,
  not all: a module that all but one feature enter (the status's types) is shared ground all the same, and
  a module that only a few features share (the launcher's book: a resize and a restart in place; the check
  the compute probe starts from) stays in each of their homes, where a reader of either opens it;
- a feature's **home** is its files minus the common ground: what a reader opens for that feature alone.

Every column is printed and recorded, files and the common ground too, so nothing is hidden by the split;
and "entered twice" counts every module, the common ground included. Issue 56's goal reads on the home: at
most 8 files, none entered twice.

Usage: ``.venv/bin/python hack/features.py [-q] [FEATURE]``: without ``-q``, each feature's entrances
and its stops in order, the modules entered twice marked; with ``-q``, the common ground on one line
(``common ground: MODULE, ...``), then one line per feature, ``FEATURE: files N, common ground C, home H,
entered twice M``. Every feature is followed either way (the common ground is theirs together); a
``FEATURE`` named prints that one. ``docs/architecture.md``'s table holds the figures
(``tests/contract/test_features.py`` checks them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import io
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import walk
from prometheus_client import CollectorRegistry

from ddp_operator.api.spec import Spec, parse
from ddp_operator.decide import checkpoints as checkpoint_room
from ddp_operator.decide import compute_probe, kueue, resize, restarts, sync_check
from ddp_operator.decide.status_builder import StatusBuilder
from ddp_operator.observe import facts, live, workloads
from ddp_operator.observe.metrics import LastResize, Progress
from ddp_operator.observe.outcome import Outcome
from ddp_trainer import contract
from ddp_trainer.checkpoint import checkpoints, provenance
from ddp_trainer.checkpoint.stores import DirectoryStore
from ddp_trainer.core import inplace
from ddp_trainer.core.config import PodEnv, TrainerConfig
from ddp_trainer.core.state import TrainState
from ddp_trainer.launch.book import Book
from ddp_trainer.reporting.metrics import TrainerMetrics
from ddp_trainer.sync import SyncConfig, SyncHealth

NOW = dt.datetime(2026, 1, 1, 0, 10, tzinfo=dt.UTC)
AT = NOW.timestamp() - 30
"""When the world before a change stopped."""


@dataclass(frozen=True)
class Entrance:
    """The functions a reader starts from on one side (trainer or operator), each called with its inputs
    in turn: ``calls``, one call into the project each, followed one by one."""

    side: str
    name: str
    calls: tuple[Callable[[], object], ...]


@dataclass
class Followed:
    """A feature followed: each entrance's stops, one list per call, and what they add up to."""

    stops: list[tuple[str, list[list[tuple[str, str]]]]]
    """Each entrance's name and the stops of each of its calls: (module, ``call`` or ``return``)."""

    @property
    def files(self) -> list[str]:
        """The distinct project modules entered, in the order first entered."""
        return list(dict.fromkeys(m for _, calls in self.stops for stops in calls for m, _ in stops))

    @property
    def entered_twice(self) -> list[str]:
        """The modules a call entered while they were still open below, each once."""
        return list(
            dict.fromkeys(stops[i][0] for _, calls in self.stops for stops in calls for i in reentered(stops))
        )


def reentered(stops: list[tuple[str, str]]) -> list[int]:
    """Which of ``stops`` entered their module again: a call into it while it was open below
    (``walk.follow``'s ``again``)."""
    return [i for i, (_, how) in enumerate(stops) if how == "again"]


# -- the inputs both sides share ------------------------------------------------------------------------


@contextlib.contextmanager
def one_rank() -> Iterator[None]:
    """A one-process gloo group: the trainer's collectives run as in a pod, with one rank."""
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def _metrics() -> TrainerMetrics:
    """A rank's ``ddp_*`` series, in a registry of their own (nothing served)."""
    labels = {name: "0" for name in contract.METRIC_LABELS}
    info = ("world_size", "device", "backend", "precision", "model", "attempt", "torch_version")
    return TrainerMetrics(labels, dict.fromkeys((*info, "fingerprint"), ""), CollectorRegistry())


def _health(**settings: Any) -> SyncHealth:
    """A ``SyncHealth`` as a loop builds one (its initial check done), with ``settings``."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    config = SyncConfig(every=10, probe_every=0, write_report=False).replace(**settings)
    pod = PodEnv(job="features", namespace="ns", node="node-a")
    batch = torch.randn(4, 8)
    with contextlib.redirect_stderr(io.StringIO()):
        return SyncHealth(model, optimizer, config, pod=pod, metrics=_metrics(), env={}, probe_batch=batch)


def _operator(kind: str) -> tuple[Spec, facts.Facts, StatusBuilder]:
    """A DDPJob of ``hack/walk.py``'s bodies (``rigid``, ``elastic``, ``kueue``), its facts and the builder
    of its next status, as ``decide/decision.decide`` has them when it asks a room."""
    body = walk._body(kind)
    jobs, pods = walk._children(body, kind)
    spec = parse(body)
    assert isinstance(spec, Spec)
    found = facts.observe(body["status"], jobs, pods, spec.metrics_port, elastic=spec.elastic is not None)
    return spec, found, StatusBuilder.for_body(body, NOW)


def _snapshot(reading: Progress) -> live.Snapshot:
    answers = [live.Answer(f"walk-1-{i}-x", "text") for i in range(2)]
    return live.record(None, 1, 9400, answers, NOW.timestamp(), reading)


def _quietly(call: Callable[[], object]) -> Callable[[], object]:
    """``call`` with what it prints to stderr (the launcher's log lines) kept off the figures' output."""

    def quiet() -> object:
        with contextlib.redirect_stderr(io.StringIO()):
            return call()

    return quiet


# -- the features ---------------------------------------------------------------------------------------


def elastic_resize() -> list[Entrance]:
    """An elastic job's world shrinks from 3 nodes to 2 (a node went silent) while ``spec.nodes`` asks for
    3: the launcher books the change (no restart), the worker of the new world records it in its metrics,
    the operator counts it into ``status.elastic`` and resizes the Job to ``spec.nodes``."""
    folder = Path(tempfile.mkdtemp())
    book = Book(folder / "state.json", elastic=True)
    book.rendezvoused(3, 1)
    env = {contract.LAUNCH_STATE_ENV: str(folder / "state.json")}
    series = _metrics()
    spec, found, out = _operator("elastic")
    job = found.job
    assert job is not None
    change = LastResize(contract.RESIZE_SILENT, 3, 2, AT, 12.5, round=2)
    reading = _snapshot(
        Progress(step=20, ranks=2, world_size=2, resizes=1, last_resize=change, changes=(change,))
    )
    return [
        Entrance("trainer", "launch.book.Book.failed, rendezvoused", (
            lambda: book.failed({}, stopped=True, why="node 2 went silent"),
            _quietly(lambda: book.rendezvoused(2, 2)),
        )),
        Entrance("trainer", "core.inplace.read_state, reporting.metrics.TrainerMetrics.resized", (
            lambda: series.resized(inplace.read_state(env), AT + 12.5),
        )),
        Entrance("operator", "decide.resize.of_reading", (
            lambda: resize.of_reading(spec, job, out, 2, NOW, reading, 1),
        )),
    ]  # fmt: skip


def fingerprint_check() -> list[Entrance]:
    """A periodic check of a model's fingerprints on a one-rank gloo group (it passes), then the operator
    reads a running attempt's checks (the metrics reading) and rank 0's report into ``status.sync`` and
    ``SyncVerified``."""
    health = _health()
    _, _, out = _operator("rigid")
    reading = Progress(step=10, ranks=2, checks_ok=2, last_check_ok=True, last_check_step=10)
    report: contract.Report = {
        "attempt": 1,
        "result": "verified",
        "checks": 3,
        "mismatches": 0,
        "repairs": 0,
        "verified": True,
        "lastCheckStep": 30,
    }
    return [
        Entrance("trainer", "sync.SyncHealth.check", (lambda: health.check("periodic"),)),
        Entrance("operator", "decide.sync_check.live, from_report, job_sync, verified", (
            lambda: out.say(sync_check.live(out.stored("sync") or {}, reading, 1)),
            lambda: sync_check.job_sync(sync_check.from_report(report), report, 1),
            lambda: sync_check.verified(out.current()),
        )),
    ]  # fmt: skip


def restart_in_place() -> list[Entrance]:
    """A rank of a rigid gang fails and the gang restarts in place: the launcher books the restart, the
    workers of the new run share what their launchers saw and record it in their metrics, and the operator
    counts it into ``status.restartsInPlace`` with its event."""
    folder = Path(tempfile.mkdtemp())
    book = Book(folder / "state.json")
    book.rendezvoused(2, 1)
    env = {contract.LAUNCH_STATE_ENV: str(folder / "state.json")}
    health = _health()
    _, found, out = _operator("rigid")
    cause = "rank 1 failed (exit 1)"
    reading = _snapshot(Progress(step=10, ranks=2, restarts_in_place=1, restart_cause=cause))
    seen: list[inplace.LaunchState] = []
    return [
        Entrance("trainer", "launch.book.Book.failed, rendezvoused", (
            lambda: book.failed({1: (1, "RuntimeError: boom")}),
            _quietly(lambda: book.rendezvoused(2, 2)),
        )),
        Entrance("trainer", "sync.SyncHealth._restarts, reporting.metrics.TrainerMetrics.restarted", (
            _quietly(lambda: seen.append(health._restarts(env))),
            lambda: health.metrics.restarted(seen[-1].restarts, seen[-1].cause),
        )),
        Entrance("operator", "decide.restarts.budget, then said", (
            lambda: out.say(restarts.budget(out, 1, found, reading).in_place),
        )),
    ]  # fmt: skip


def compute_probe_() -> list[Entrance]:
    """A compute probe on a one-rank gloo group (its verdict, and what rank 0's report says of it), then
    the operator reads a report that names a faulty rank into ``status.probe``, marks its node and keeps
    the next attempt's pods off it."""
    health = _health(probe_every=10)
    _, _, out = _operator("rigid")
    report: contract.Report = {
        "attempt": 1,
        "result": "faulty",
        "reason": contract.FAULTY_RANK,
        "message": "rank 1 computes differently from the others",
        "faultyRanks": [1],
        "probeVerdict": "faulty",
        "probeWhy": "rank 1's loss differs",
        "failures": [{"rank": 1, "node": "node-b", "device": "cuda:0"}],
    }
    outcome = Outcome(False, {1: contract.FAULTY_RANK_EXIT_CODE}, report, contract.FAULTY_RANK)
    return [
        Entrance("trainer", "sync.SyncHealth.run_probe, probe_summary", (
            health.run_probe,
            lambda: health.probe_summary({}),
        )),
        Entrance("operator", "decide.compute_probe.from_report, faulty_rank_found, nodes_to_avoid", (
            lambda: out.set(probe=compute_probe.from_report({}, report, 1)),
            lambda: compute_probe.faulty_rank_found(out, outcome),
            lambda: compute_probe.nodes_to_avoid(out.current(), ["node-c"]),
        )),
    ]  # fmt: skip


def kueue_reason() -> list[Entrance]:
    """A queued DDPJob's Job waits for quota: the index keeps its Workload, the reconcile picks the
    current one, and the decision says the phase reason in Kueue's words with ``status.kueue``."""
    spec, found, _ = _operator("kueue")
    assert found.job is not None
    job = found.job.name
    waiting = {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "no quota"}
    body = {
        "metadata": {"name": f"job-{job}-1", "ownerReferences": [{"kind": "Job", "name": job}]},
        "status": {"conditions": [waiting]},
    }
    kept: dict[str, Any] = {}
    read: list[Any] = []
    return [
        Entrance("operator", "observe.workloads.owner_job, slim, current (the index, the reconcile)", (
            lambda: workloads.owner_job(body),
            lambda: kept.setdefault("slim", workloads.slim(body)),
            lambda: kept.setdefault(job, workloads.current([kept["slim"]])),
        )),
        Entrance("operator", "decide.kueue.workload, workload_status, queued", (
            lambda: read.append(kueue.workload(spec, found.job, kept)),
            lambda: kueue.workload_status(read[-1]),
            lambda: kueue.queued("team-q", job, read[-1]),
        )),
    ]  # fmt: skip


def checkpoint_identity() -> list[Entrance]:
    """What makes a checkpoint this job's, and this world's: rank 0 of a first world stamps its writer
    (the DDPJob, the settings that shape the model), fences its world and saves a verified state; a
    second world of the same job (restarted) chooses it, checked against its own identity, and fences
    itself; the operator says what was restored."""
    store = DirectoryStore(Path(tempfile.mkdtemp()))
    config, model = TrainerConfig(), _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = TrainState(model, optimizer, torch.amp.GradScaler("cpu", enabled=False), step=10)
    _, _, out = _operator("rigid")
    report: contract.Report = {"attempt": 2, "result": "verified", "resumedFromStep": 10}
    writers: list[provenance.Writer] = []

    def writer(attempt: int) -> None:
        settings = provenance.settings_of(config, 1, precision="fp32", optimizer="SGD")
        writers.append(provenance.Writer(provenance.Identity("ns", "walk", "u-1"), settings, attempt))

    def restore() -> None:
        choice = checkpoints.restore_on_rank0(store, writers[-1], "")
        writers[-1] = dataclasses.replace(writers[-1], world=choice.world)  # as the runner numbers it

    return [
        Entrance("trainer", "checkpoint.provenance.settings_of, checkpoints.restore_on_rank0, save", (
            lambda: writer(1),
            restore,
            lambda: checkpoints.save(store, state, writers[-1], 3),
        )),
        Entrance("trainer", "the next world: provenance.settings_of, checkpoints.restore_on_rank0", (
            lambda: writer(2),
            restore,
        )),
        Entrance("operator", "decide.checkpoints.from_report, restored_events", (
            lambda: out.set(checkpoint=checkpoint_room.from_report(report)),
            lambda: checkpoint_room.restored_events(out, report),
        )),
    ]  # fmt: skip


FEATURES: dict[str, Callable[[], list[Entrance]]] = {
    "elastic-resize": elastic_resize,
    "fingerprint-check": fingerprint_check,
    "restart-in-place": restart_in_place,
    "compute-probe": compute_probe_,
    "kueue-reason": kueue_reason,
    "checkpoint-identity": checkpoint_identity,
}
"""Issue 56's six features, each with the scenario that calls its entrances."""


def follow(feature: str) -> Followed:
    """``feature``'s scenario run once to warm the caches (imports, compiled kernels, the CRD), then once
    followed, each entrance in turn and each of its calls."""
    for entrance in FEATURES[feature]():
        for call in entrance.calls:
            call()
    return Followed([(e.name, [walk.follow(call) for call in e.calls]) for e in FEATURES[feature]()])


def common_ground(followed: dict[str, Followed]) -> list[str]:
    """The modules entered by at least half of the ``followed`` features, in the order first entered: the
    house's shared ground, read once for all features (the module docstring says why)."""
    entered = [m for each in followed.values() for m in each.files]
    return [m for m in dict.fromkeys(entered) if 2 * entered.count(m) >= len(followed)]


def main() -> None:
    names = [arg for arg in sys.argv[1:] if arg in FEATURES] or list(FEATURES)
    os.environ.setdefault("DDPJOB_FINGERPRINT_IMPL", "numpy")  # the same kernel on every machine
    with one_rank():
        followed = {name: follow(name) for name in FEATURES}  # all of them: the common ground is theirs
    shared = common_ground(followed)
    print(f"common ground: {', '.join(shared)}")
    for name in names:
        files, twice = followed[name].files, followed[name].entered_twice
        home = [m for m in files if m not in shared]
        if "-q" not in sys.argv:
            print(f"{name}:")
            for entrance, calls in followed[name].stops:
                print(f"  {entrance}:")
                for stops in calls:
                    again = set(reentered(stops))
                    path = " → ".join(m + ("*" if i in again else "") for i, (m, _) in enumerate(stops))
                    print(f"    {path}")
            print(f"  files: {', '.join(files)}")
            print(f"  home: {', '.join(home)}")
            if twice:
                print(f"  entered twice: {', '.join(twice)}")
        print(
            f"{name}: files {len(files)}, common ground {len(files) - len(home)}, home {len(home)}, "
            f"entered twice {len(twice)}"
        )


if __name__ == "__main__":
    main()
