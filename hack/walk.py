"""The newcomer's walk: follow one DDPJob body through ``reconcile.reconcile`` and count the rooms (modules).

Runs one reconcile of a running two-pod DDPJob (a metrics reading in hand, so the live status is built
too) with the API calls left out (``ignore`` of ``reconcile`` and ``reads``, and ``reconcile._event``,
answer nothing), and records,
with ``sys.setprofile``, which of this project's modules the code is in at every call and every return.
Consecutive steps in the same module are one stop. It prints the stops in order, then

    stops: N, returns: M, modules: K

where ``returns`` counts the stops at a module the walk had already left (a reader going back to a file
already read). Third-party code (kubernetes, prometheus_client, jsonschema, celpy) is not counted: the
walk passes through it as through a corridor. A first reconcile warms the caches (the CRD, the schema);
the second is the one counted. Usage: ``.venv/bin/python hack/walk.py [-q] [rigid|elastic|kueue]``
(``-q``: the totals only). The body walked is the running two-pod rigid job by default (the figures of
docs/architecture.md's table); ``elastic``: an elastic job (1-4 nodes) whose two pods train while
``spec.nodes`` asks for 3, so the Job is resized in place; ``kueue``: a job queued on Kueue, its Job
suspended and its Workload waiting for quota (issue 56's three bodies).
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import ddp_operator
import ddp_trainer
from ddp_operator.api.spec import parse
from ddp_operator.children import render
from ddp_operator.observe import live
from ddp_operator.observe.metrics import Progress
from ddp_operator.runtime import reads, reconcile

ROOTS = {Path(ddp_operator.__file__).parent: "ddp_operator", Path(ddp_trainer.__file__).parent: "ddp_trainer"}


def module_of(frame: FrameType | None) -> str | None:
    """The project module of the nearest project frame at or above ``frame``."""
    while frame is not None:
        if (module := _own_module(frame)) is not None:
            return module
        frame = frame.f_back
    return None


def _own_module(frame: FrameType) -> str | None:
    """The project module whose code ``frame`` runs; None for any other code."""
    path = Path(frame.f_code.co_filename)
    for root, package in ROOTS.items():
        if path.is_relative_to(root):
            parts = path.relative_to(root).with_suffix("").parts
            return ".".join((package, *parts)).removesuffix(".__init__")
    return None


BODIES = ("rigid", "elastic", "kueue")
"""The bodies the walk can follow (the first is the default)."""


def _body(kind: str = "rigid") -> dict[str, Any]:
    spec: dict[str, Any] = {"nodes": 2, "procsPerNode": 1, "device": "cpu", "maxRestarts": 1}
    if kind == "elastic":  # 2 pods train, 3 are asked: the Job grows in place
        spec.update(nodes=3, elastic={"minNodes": 1, "maxNodes": 4})
    elif kind == "kueue":
        spec.update(queueName="team-q")
    return {
        "apiVersion": "ddpjob.io/v1alpha1",
        "kind": "DDPJob",
        "metadata": {"name": "walk", "namespace": "ns", "generation": 1, "uid": "u-1"},
        "spec": spec,
        "status": {"phase": "Pending", "attempt": 1, "startTime": "2026-01-01T00:00:00Z"},
    }


def _workloads(kind: str, jobs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The queued body's Workload, as the index keeps it: no quota reserved yet."""
    if kind != "kueue":
        return None
    name = jobs[0]["metadata"]["name"]
    waiting = {
        "type": "QuotaReserved",
        "status": "False",
        "reason": "Pending",
        "message": "insufficient quota",
    }
    return {name: {"metadata": {"name": f"job-{name}-1"}, "status": {"conditions": [waiting]}}}


def _children(body: dict[str, Any], kind: str = "rigid") -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    job = render.render_job(parse(body), 1)
    if kind == "elastic":
        job["spec"]["completions"] = job["spec"]["parallelism"] = 2
    if kind == "kueue":
        job["spec"]["suspend"] = True
        return [job], []
    pod_meta = job["spec"]["template"]["metadata"]
    pods = [
        {
            "metadata": {
                "name": f"walk-1-{i}-x",
                "labels": dict(pod_meta["labels"]),
                "annotations": {"batch.kubernetes.io/job-completion-index": str(i)},
            },
            "status": {
                "phase": "Running",
                "podIP": f"10.0.0.{i + 1}",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "trainer", "state": {"running": {}}}],
            },
        }
        for i in range(2)
    ]
    return [job], pods


class _Scraper:
    """Holds one reading of the pods' metrics, as :class:`ddp_operator.runtime.scraper.Scraper` would."""

    def __init__(self) -> None:
        reading = Progress(
            step=10, samples=320.0, ranks=2, checks_ok=2, last_check_ok=True, last_check_step=10
        )
        answers = [live.Answer(f"walk-1-{i}-x", "text") for i in range(2)]
        self.snapshot = live.record(None, 1, 9400, answers, time.time(), reading)

    def latest(self, key: object) -> live.Snapshot:
        return self.snapshot

    def want(self, *args: object) -> bool:
        return True

    def forget(self, key: object) -> None:
        pass


def walk(kind: str = "rigid") -> list[str]:
    reconcile.ignore = reads.ignore = lambda *args, **kwargs: None  # type: ignore[assignment]  # no API server
    reconcile._event = lambda *args, **kwargs: None  # type: ignore[assignment]
    body = _body(kind)
    jobs, pods = _children(body, kind)
    workloads = _workloads(kind, jobs)
    logger = __import__("logging").getLogger("walk")
    # warm the caches
    reconcile.reconcile(body, jobs, pods, logger, _Scraper(), None, workloads)  # type: ignore[arg-type]
    scraper = _Scraper()

    def counted() -> None:
        reconcile.reconcile(body, jobs, pods, logger, scraper, None, workloads)  # type: ignore[arg-type]

    return [module for module, _ in follow(counted)]


GENERATOR = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def follow(run: Callable[[], object]) -> list[tuple[str, str]]:
    """The stops of ``run()``, in order: (the project module, how it was reached). A stop is recorded,
    with ``sys.setprofile``, each time the module of the nearest project frame changes, at a call or a
    return. How: ``return`` (a return came back to it), ``call`` (a call entered it), ``again`` (a call
    entered it while a frame of it is still open below, the reader sent back into a file they have not
    finished), ``resume`` (a generator it wrote, started or resumed by the code that iterates it: a value
    being read, read where it is written; and so the frames below a generator's are not its reader's).
    ``hack/features.py`` follows its features with it."""
    stops: list[tuple[str, str]] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            here = module_of(frame)
            how = "resume" if frame.f_code.co_flags & GENERATOR else "call"
            if how == "call" and here is not None and here != module_of(frame.f_back):
                how = "again" if here in _open_below(frame.f_back) else "call"
        elif event == "return":
            here, how = module_of(frame.f_back), "return"
        else:
            return
        if here is not None and (not stops or stops[-1][0] != here):
            stops.append((here, how))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return stops


def _open_below(frame: FrameType | None) -> set[str]:
    """The project modules with a frame open at or below ``frame`` (its callers), up to the first
    generator's frame."""
    found: set[str] = set()
    while frame is not None:
        if (module := _own_module(frame)) is not None:
            found.add(module)
        if frame.f_code.co_flags & GENERATOR:
            break
        frame = frame.f_back
    return found


def main() -> None:
    kinds = [arg for arg in sys.argv[1:] if arg in BODIES]
    stops = walk(kinds[0] if kinds else BODIES[0])
    returns = sum(1 for i, name in enumerate(stops) if name in stops[:i])
    if "-q" not in sys.argv:
        print(" → ".join(name.removeprefix("ddp_operator.") for name in stops))
    print(f"stops: {len(stops)}, returns: {returns}, modules: {len(set(stops))}")


if __name__ == "__main__":
    main()
