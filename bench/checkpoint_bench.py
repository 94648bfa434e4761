"""Checkpoint write and read throughput: a folder (a volume) vs object storage (MinIO on this machine).

Both go through the trainer's own path: ``checkpoints.save`` (serialize, header with sha256, publish
atomically, prune) and ``checkpoints.choose_on_rank0`` (list, read, verify the sha256, ``torch.load``
check), for a model of the given size (fp32 ``Linear`` layers, an SGD optimizer without state, so the
payload is the weights). The folder and MinIO's data directory are on the same disk, so the difference is
the protocol (HTTP, signature v4, MinIO's own write path), not the medium. Best of ``--runs`` runs each,
taken in turns.

    PYTHONPATH=tests .venv/bin/python bench/checkpoint_bench.py [--sizes-mb 64 256] [--runs 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from ddp_trainer.checkpoint import checkpoints, provenance
from ddp_trainer.checkpoint.objectstore import S3Store
from ddp_trainer.checkpoint.stores import DirectoryStore, Store
from ddp_trainer.core.config import TrainerConfig
from ddp_trainer.core.state import TrainState
from ddp_trainer.train.loop import Precision
from helpers.s3server import running_minio  # tests/helpers/s3server.py: PYTHONPATH=tests

WRITER = provenance.Writer(
    provenance.Identity("bench", "bench", "u1"),
    provenance.settings_of(TrainerConfig(), 1, precision="fp32", optimizer="SGD"),
)


def _state(megabytes: int) -> TrainState:
    width = 1024
    layers = max(1, megabytes * 2**20 // (width * width * 4))
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False) for _ in range(layers)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return TrainState(model, optimizer, Precision.of(torch.device("cpu"), "fp32").scaler(), step=1)


def _once(store: Store, state: TrainState) -> tuple[float, float, int]:
    """Seconds to save, seconds to choose (read + verify), and the checkpoint's bytes."""
    state.step += 1
    started = time.perf_counter()
    checkpoints.save(store, state, WRITER, keep=1)
    saved = time.perf_counter() - started
    started = time.perf_counter()
    choice = checkpoints.choose_on_rank0(store, WRITER, "")
    read = time.perf_counter() - started
    assert choice.action == "resume" and choice.step == state.step and choice.payload is not None
    return saved, read, len(choice.payload)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-") as tmp:
        root = Path(tmp)
        (root / "minio").mkdir()
        with running_minio(root / "minio", root / "minio.log") as server:
            server.client().make_bucket("bench")  # type: ignore[attr-defined]
            stores: dict[str, Store] = {
                "folder": DirectoryStore(root / "folder"),
                "s3 (MinIO)": S3Store.from_url("s3://bench/run", server.env()),
            }
            print("| size | store | save s | save MB/s | read+verify s | read MB/s |")
            print("|---:|---|---:|---:|---:|---:|")
            for megabytes in args.sizes_mb:
                state = _state(megabytes)
                best: dict[str, tuple[float, float, int]] = {}
                for _ in range(args.runs):
                    for name, store in stores.items():  # in turns, so load hits both alike
                        saved, read, size = _once(store, state)
                        old = best.get(name)
                        best[name] = (
                            min(saved, old[0]) if old else saved,
                            min(read, old[1]) if old else read,
                            size,
                        )
                for name, (saved, read, size) in best.items():
                    mb = size / 1e6
                    rates = f"{saved:.2f} | {mb / saved:.0f} | {read:.2f} | {mb / read:.0f}"
                    print(f"| {mb:.0f} MB | {name} | {rates} |")


if __name__ == "__main__":
    main()
