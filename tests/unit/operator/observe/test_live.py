"""live: a running job's metrics readings, seen through status.progress: ETA, rates, restarts, pods that do
not answer."""

from __future__ import annotations

from ddp_operator.decide.progress import progress_status
from ddp_operator.observe import live, metrics
from ddp_operator.observe.metrics import Progress

T0 = 1_800_000_000.0


def _reading(step: int, samples: float, **extra: object) -> Progress:
    return Progress(step=step, samples=samples, ranks=2, **extra)  # type: ignore[arg-type]


def _answers(*texts: str | None, refused: bool = False) -> list[live.Answer]:
    return [
        live.Answer(f"job-1-{i}", text, refused=refused and text is None, error="" if text else "timed out")
        for i, text in enumerate(texts)
    ]


def test_eta_and_throughput_come_from_two_readings() -> None:
    first = live.record(None, 1, 9400, _answers("a", "b"), T0, _reading(100, 3200.0))
    second = live.record(first, 1, 9400, _answers("a", "b"), T0 + 10, _reading(150, 4800.0))
    assert live.rates(second) == (5.0, 160.0)
    status = progress_status(second, 1000)
    assert status["step"] == 150 and status["percent"] == 15 and status["summary"] == "15%"
    assert status["samplesPerSecond"] == 160.0 and status["etaSeconds"] == 170 and status["eta"] == "2m50s"
    assert status["etaTime"] == "2027-01-15T08:03:00Z" and status["computedAt"] == "2027-01-15T08:00:10Z"
    assert "unreachable" not in status


def test_before_two_readings_the_step_time_histogram_gives_the_rate() -> None:
    only = live.record(
        None,
        1,
        9400,
        _answers("a"),
        T0,
        _reading(20, 1280.0, step_times={"0": (2.0, 20.0), "1": (3.0, 20.0)}),
    )
    assert live.rates(only) == (10.0, 640.0)
    status = progress_status(only, 220)
    assert (status["etaSeconds"], status["slowestRank"], status["slowestStepSeconds"]) == (20, 1, 0.15)


def test_a_restart_inside_the_attempt_resets_the_rate_and_a_new_attempt_starts_over() -> None:
    first = live.record(None, 1, 9400, _answers("a"), T0, _reading(100, 3200.0))
    reset = live.record(first, 1, 9400, _answers("a"), T0 + 10, _reading(3, 96.0))
    assert reset.earlier is None and live.rates(reset) == (None, None)
    assert "etaSeconds" not in progress_status(reset, 1000)
    other = live.record(first, 2, 9400, _answers("a"), T0 + 10, _reading(120, 640.0))
    assert other.earlier is None


def test_the_rate_window_moves() -> None:
    snap = live.record(None, 1, 9400, _answers("a"), T0, _reading(0, 0.0))
    for i in range(1, 9):
        snap = live.record(snap, 1, 9400, _answers("a"), T0 + 10 * i, _reading(10 * i, 0.0))
    assert T0 + 10 <= snap.earlier_at < snap.at and snap.at - snap.earlier_at <= live.RATE_WINDOW_SECONDS


def test_pods_that_do_not_answer_are_named() -> None:
    snap = live.record(None, 1, 9400, _answers("text", None), T0, _reading(5, 10.0))
    assert snap.unreachable == ("job-1-1: timed out",)
    assert progress_status(snap, 10)["unreachable"] == ["job-1-1"]
    none = live.record(None, 1, 9400, _answers(None, None, refused=True), T0, None)
    assert none.refused == ("job-1-0", "job-1-1") and progress_status(none, 10).keys() == {
        "computedAt",
        "unreachable",
    }


def test_durations_fit_a_column() -> None:
    assert [metrics.duration(s) for s in (0, 45.4, 200, 3720, -5)] == ["0s", "45s", "3m20s", "1h02m", "0s"]


def test_without_a_total_the_status_shows_the_step_and_the_rates_and_no_percent_or_eta() -> None:
    """A command of the user's whose code says no total (the no-code-change hook): spec.trainer.steps is not
    its total, so nothing is made up from it."""
    first = live.record(None, 1, 9400, _answers("a", "b"), T0, _reading(100, 3200.0))
    second = live.record(first, 1, 9400, _answers("a", "b"), T0 + 10, _reading(150, 4800.0))
    status = progress_status(second, 0)
    assert (status["step"], status["summary"], status["stepsPerSecond"]) == (150, "step 150", 5.0)
    assert not {"percent", "totalSteps", "etaSeconds", "eta", "etaTime"} & status.keys(), status
    said = metrics.line(second.latest, 0, 10.0)  # no loss reported: left out, not a '-' placeholder
    assert said.startswith("step 150  480 samples/s") and " - " not in said and "%" not in said, said
    assert progress_status(second, 0).keys() != progress_status(second, 1000).keys()


def test_the_spec_knows_the_total_only_for_the_built_in_trainer() -> None:
    from dataclasses import replace

    from ddp_operator.api.spec import known_total_steps, parse

    doc = {
        "apiVersion": "ddpjob.io/v1alpha1",
        "kind": "DDPJob",
        "metadata": {"name": "t"},
        "spec": {"nodes": 1},
    }
    built_in = parse(doc)
    assert known_total_steps(built_in) == built_in.trainer.steps > 0
    assert known_total_steps(replace(built_in, command=("torchrun",), args=("train.py",))) == 0


def test_the_world_and_its_last_resize_are_read_from_the_pods_metrics() -> None:
    """Rank 0's ddp_info says the world (a replaced description, at 0, does not); the last resize is the
    highest round's; every change once per round, whichever pods say it (at the earliest stop said), and
    restarted where any pod says so (round 4: pod 0 healed, pod 1's workers restarted; an older trainer
    says no mode: restarted)."""
    labels = 'ddpjob="j",ddpjob_namespace="ns"'
    pod0 = (
        f'ddp_info{{{labels},rank="0",node_rank="0",world_size="6"}} 0.0\n'
        f'ddp_info{{{labels},rank="0",node_rank="0",world_size="4"}} 1.0\n'
        f'ddp_elastic_resizes{{{labels},rank="0",node_rank="0"}} 2.0\n'
        f'ddp_resize_info{{{labels},rank="0",node_rank="0",reason="NodeRejoined",from_nodes="1",'
        'to_nodes="3",round="4",mode="healed"} 899.5\n'
        f'ddp_resize_info{{{labels},rank="0",node_rank="0",reason="NodeSilent",from_nodes="3",'
        'to_nodes="2",round="6",mode="healed"} 1000.5\n'
        f'ddp_last_resize_seconds_lost{{{labels},rank="0",node_rank="0"}} 8.25\n'
    )
    pod1 = (
        f'ddp_info{{{labels},rank="2",node_rank="1",world_size="4"}} 1.0\n'
        f'ddp_elastic_resizes{{{labels},rank="2",node_rank="1"}} 1.0\n'
        f'ddp_resize_info{{{labels},rank="2",node_rank="1",reason="NodeRejoined",from_nodes="1",'
        'to_nodes="3",round="4"} 900.0\n'
    )
    read = metrics.parse([pod1, pod0])
    assert (read.world_size, read.resizes) == (4, 2)
    assert read.last_resize == metrics.LastResize("NodeSilent", 3, 2, 1000.5, 8.25, round=6, mode="healed")
    assert [(c.round, c.reason, c.at, c.mode) for c in read.changes] == [
        (4, "NodeRejoined", 899.5, "restarted"),
        (6, "NodeSilent", 1000.5, "healed"),
    ]
    assert metrics.parse([f'ddp_step{{{labels},rank="0",node_rank="0"}} 3.0\n']).world_size is None
    healed = (
        f'ddp_last_resize_steps_lost{{{labels},rank="0",node_rank="0"}} 1.0\n'
        f'ddp_last_resize_bytes_sent{{{labels},rank="0",node_rank="0"}} 82992.0\n'
    )
    cost = metrics.parse([pod1, pod0 + healed]).last_resize
    assert cost is not None and (cost.steps_lost, cost.bytes_sent) == (1, 82992), cost
    restarted = pod0.replace('round="6",mode="healed"', 'round="6",mode="restarted"')
    cost = metrics.parse([pod1, restarted + healed]).last_resize  # a restarted world's heal gauges: not its
    assert cost is not None and (cost.steps_lost, cost.bytes_sent) == (None, None), cost
