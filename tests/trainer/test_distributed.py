"""The launcher environment (:mod:`ddp_trainer.distributed`)."""

from __future__ import annotations

from ddp_trainer.distributed import read_launch_env


def test_launcher_environment() -> None:
    launch = read_launch_env({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "GROUP_RANK": "2"})
    assert (launch.rank, launch.local_rank, launch.world_size, launch.node_rank, launch.launched) == (
        5,
        1,
        8,
        2,
        True,
    )
    assert not read_launch_env({}).launched
