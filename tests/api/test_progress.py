"""progress: what a person watching sees, from the trainer's metrics and its report."""

from __future__ import annotations

from ddp_operator import progress

METRICS_POD0 = """
ddp_steps_total{job="j",namespace="n",node_rank="0",rank="0"} 40.0
ddp_steps_total{job="j",namespace="n",node_rank="0",rank="1"} 41.0
ddp_samples_total{job="j",namespace="n",node_rank="0",rank="0"} 1280.0
ddp_samples_total{job="j",namespace="n",node_rank="0",rank="1"} 1312.0
ddp_loss{job="j",namespace="n",node_rank="0",rank="0"} 0.5
ddp_loss{job="j",namespace="n",node_rank="0",rank="1"} 0.7
ddp_sync_checks_total{job="j",kind="periodic",namespace="n",node_rank="0",rank="0",result="ok"} 2.0
ddp_sync_checks_total{job="j",kind="initial",namespace="n",node_rank="0",rank="0",result="ok"} 1.0
ddp_sync_checks_total{job="j",kind="periodic",namespace="n",node_rank="0",rank="1",result="ok"} 3.0
"""
METRICS_POD1 = """
ddp_steps_total{job="j",namespace="n",node_rank="1",rank="2"} 42.0
ddp_samples_total{job="j",namespace="n",node_rank="1",rank="2"} 1344.0
ddp_sync_checks_total{job="j",kind="periodic",namespace="n",node_rank="1",rank="2",result="mismatch"} 1.0
"""


def test_progress_from_metrics() -> None:
    now = progress.parse([METRICS_POD0, METRICS_POD1])
    assert now == progress.Progress(
        step=40, samples=3936.0, loss=0.5, checks_ok=3, checks_mismatch=0, ranks=3
    )
    first = progress.Progress(samples=936.0)
    assert progress.line(now, 200, 2.0, first) == (
        "step 40/200 (20%)  loss 0.5000  1,500 samples/s  sync checks: 3 ok"
    )
    assert "1 MISMATCH" in progress.line(progress.parse([METRICS_POD1]), 200, 1.0)


def test_sync_sentence() -> None:
    assert progress.sync_sentence(
        {"verified": True, "checks": 7, "worldSize": 4, "lastCheckStep": 300, "repairs": 0}
    ) == ("replicas verified bit-identical 7 times across 4 ranks (last check at step 300)")
    diverged = progress.sync_sentence(
        {
            "verified": False,
            "checks": 3,
            "mismatches": 1,
            "mismatchedTensors": ["0.weight"],
            "message": "rank 1 differs",
        }
    )
    assert diverged.startswith("replicas DIVERGED: 1 of 3 checks found ranks differing (0.weight)")
    assert progress.sync_sentence(None).startswith("not reported")
