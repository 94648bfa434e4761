"""How fast is the fingerprint next to simply reading the same bytes? Ratios measured side by side.

    python bench/fingerprint_bench.py              # CPU, one thread: 5 M and 50 M parameters
    python bench/fingerprint_bench.py --gpu        # CUDA: the 1.3 B-parameter GPT-like set (292 tensors)
    python bench/fingerprint_bench.py --host-work  # no GPU needed: the torch fallback's host work per call

Needs only this checkout, torch and numpy (and Triton for the GPU kernel): it puts ``trainer_image`` on
``sys.path`` itself. Prints figures, never asserts timings.

Every ratio is one way (``bench/paired.py``): a warm-up, then ``--rounds`` (5) paired rounds in ABBA
order, the floor as A and the fingerprint as B; the median of the per-round ratios floor / fingerprint,
their spread (min-max) and the verdict: ``met`` only when the whole spread clears the goal, else
``unresolved`` or ``unmet``.

CPU (``torch.set_num_threads(1)``), per size, dtype and fingerprint path, timed by ``time.perf_counter``:

* ``read``: ``t.sum()`` in the tensor's own dtype, the fastest plain read of the bytes (the floor);
* ``numba`` (where installed) and ``numpy``: the fingerprint's CPU paths; ``torch``: its pure-torch path;
* ratio ``read / fingerprint``: verdicts against the goal 0.8 and the minimum 0.3.

GPU (CUDA events, each sample between a ``torch.cuda.synchronize()`` and the end event): the floor is a
read of the same bytes: ``triton_kernel.read_blocks``, the fingerprint's first launch with the hash taken
out (the same grid over the same block table, the same loads, a plain wrapping sum), timed exactly as the
figure it is the floor of (as many calls back to back, or one alone) and alternated with it in ABBA
rounds. The Triton path ten calls back to back (GPU time per call: the host work of one call overlaps the
GPU work of the one before, as behind a training step; goal 0.8) and one call alone (its host work
included, the floor's too); the pure-torch fallback five back to back (goal 0.1) and alone;
``torch._foreach_norm`` (one fused launch group, not bit-exact) for scale; ``torch.sum``'s read bandwidth
over one other 2 GiB buffer for reference; a check that both paths agree, and the check overhead at the
default interval for a given step time.

``--host-work`` (any machine): what the pure-torch fallback's host does per call on the same 1.3 B set,
the Python and the views it makes, with every device operation replaced by a no-op (the tensors are CPU
tensors that are never touched): on a GPU that work runs beside the kernels, and what the GPU waits for
before the first one. Best of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "trainer_image"))

import paired
import torch

from ddp_trainer.sync import fingerprints


def best_in_turns(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Best wall time of each function (seconds), the functions run in turns ``repeat`` times."""
    for fn in fns.values():
        fn()  # warm up
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            started = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - started)
    return {name: min(values) for name, values in samples.items()}


def cpu(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    from ddp_trainer.sync.fingerprints import numba_kernel

    if numba_kernel.available():
        import numba

        numba.set_num_threads(1)
    print(f"CPU, 1 thread; torch {torch.__version__}; {args.rounds} paired rounds (ABBA) per ratio")
    paths = ("numba", "numpy", "torch") if numba_kernel.available() else ("numpy", "torch")
    print(f"{'params':>8} {'dtype':>8} {'MB':>7} {'path':>6} {'read ms':>8} {'path ms':>8}  read / path")
    for millions in args.sizes:
        for dtype in (torch.float32, torch.bfloat16):
            t = torch.randn(int(millions * 1e6)).to(dtype)
            fns: dict[str, Callable[[], object]] = {
                "numba": lambda t=t: fingerprints.numpy_fingerprint(t, compiled=True),
                "numpy": lambda t=t: fingerprints.numpy_fingerprint(t),
                "torch": lambda t=t: fingerprints.torch_fingerprint(t),
            }
            name, megabytes = str(dtype).removeprefix("torch."), t.numel() * t.element_size() / 1e6
            for path in paths:
                got = paired.compare(
                    paired.timed(t.sum), paired.timed(fns[path]), over="a/b", goal=0.8, rounds=args.rounds
                )
                least = paired.verdict(got.low, got.high, 0.3, "at least")
                read_ms, path_ms = statistics.median(got.a) * 1e3, statistics.median(got.b) * 1e3
                print(
                    f"{millions:7g}M {name:>8} {megabytes:7.0f} {path:>6} {read_ms:8.2f} {path_ms:8.2f}  "
                    f"{got.said()}; >= 0.3: {least}"
                )
            del t


def gpt_shapes(vocab: int, width: int, layers: int) -> list[tuple[int, ...]]:
    """The parameter shapes of a GPT-2-style model: 4 + 12 per layer (292 for 24 layers)."""
    shapes: list[tuple[int, ...]] = [(vocab, width), (width, width)]  # token and position embeddings
    for _ in range(layers):
        shapes += [(width,), (width,), (3 * width, width), (3 * width,), (width, width), (width,)]
        shapes += [(width,), (width,), (4 * width, width), (4 * width,), (width, 4 * width), (width,)]
    return [*shapes, (width,), (width,)]


def gpt_like(vocab: int, width: int, layers: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """The parameter tensors of :func:`gpt_shapes`, random, on the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    return [
        torch.randn(s, device="cuda", dtype=dtype, generator=gen) for s in gpt_shapes(vocab, width, layers)
    ]


def host_work(args: argparse.Namespace) -> None:
    """The torch fallback's host work per call, its device operations replaced by no-ops (see above)."""
    import types
    from unittest import mock

    from ddp_trainer.sync.fingerprints import torch_kernel, torch_plan
    from ddp_trainer.sync.fingerprints.definition import BLOCK

    rows = torch_plan.CHUNK_BYTES["cuda"] // (8 * BLOCK)
    work = torch.empty(rows, BLOCK, dtype=torch.int64)  # the chunk buffer's size; never written
    stub = types.SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")})
    stub._foreach_copy_ = stub._foreach_zero_ = lambda *a, **k: None
    stub.sum = lambda *a, **k: None
    stub.empty = lambda size, dtype, device: torch.empty(size, dtype=dtype)  # the block sums
    gpu = types.SimpleNamespace(type="cuda")  # _block_sums reads only the device's type
    print(f"torch fallback, host work per call (device operations are no-ops), best of {args.repeat}")
    with (
        mock.patch.object(torch_kernel, "torch", stub),
        mock.patch.object(torch_kernel, "_fused", lambda: lambda buf, keys: buf),
        mock.patch.object(torch_kernel, "_buffers", lambda device, rows: (work[0], work[:rows])),
        mock.patch.object(torch_kernel, "_ints", lambda values, device: torch.tensor(values)),
    ):
        for dtype in (torch.float32, torch.bfloat16):
            tensors = [torch.empty(s, dtype=dtype) for s in gpt_shapes(args.vocab, args.width, args.layers)]
            geometry = torch_plan.geometry_for(tensors, torch.device("cuda"))

            def call(t: list[torch.Tensor] = tensors, g: Any = geometry) -> object:
                return torch_kernel._block_sums(t, g, gpu)  # type: ignore[arg-type]

            best = best_in_turns({"host": call}, args.repeat)["host"]
            name = str(dtype).removeprefix("torch.")
            direct = sum(c.direct for c in geometry.chunks)
            chunks = f"{len(geometry.chunks)} chunks ({direct} read in place)"
            print(f"  {name:9s} {len(tensors)} tensors, {chunks}: {best * 1e3:.2f} ms")


def cuda_median(fn: Callable[[], object], repeat: int) -> float:
    """Median of ``repeat`` timings (seconds) with CUDA events."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def forced(impl: str, tensors: list[torch.Tensor]) -> Callable[[], torch.Tensor]:
    def run() -> torch.Tensor:
        os.environ["DDPJOB_FINGERPRINT_IMPL"] = impl
        try:
            return fingerprints.fingerprint_tensors(tensors)
        finally:
            del os.environ["DDPJOB_FINGERPRINT_IMPL"]

    return run


def cuda_sampler(fn: Callable[[], object], calls: int = 1) -> Callable[[], float]:
    """A ``paired`` sampler: seconds per call of ``calls`` calls back to back, between CUDA events, after a
    ``torch.cuda.synchronize()`` (one call alone includes its host work: the GPU waits for it)."""

    def sample() -> float:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls

    return sample


FIGURES = {  # name: (path, calls back to back, goal for floor / fingerprint)
    "triton": ("triton", 10, 0.8),
    "triton_alone": ("triton", 1, None),
    "torch": ("torch", 5, 0.1),
    "torch_alone": ("torch", 1, None),
}


def gpu_figures(tensors: list[torch.Tensor], rounds: int) -> dict[str, paired.Paired]:
    """Floor / fingerprint for each of :data:`FIGURES`, in paired rounds. The floor sample: the read-only
    kernel over the same block table (``triton_kernel.read_blocks``), as many calls back to back as the
    fingerprint's sample."""
    from ddp_trainer.sync.fingerprints import triton_kernel

    def floor(calls: int) -> Callable[[], float]:
        return cuda_sampler(lambda: triton_kernel.read_blocks(tensors), calls)

    return {
        name: paired.compare(
            floor(calls), cuda_sampler(forced(path, tensors), calls), over="a/b", goal=goal, rounds=rounds
        )
        for name, (path, calls, goal) in FIGURES.items()
    }


def gpu(args: argparse.Namespace) -> None:
    if not torch.cuda.is_available():
        sys.exit("--gpu: torch.cuda.is_available() is False")
    from ddp_trainer.sync.fingerprints import triton_kernel

    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; {args.rounds} paired rounds (ABBA)")
    print(f"triton: {'available' if triton_kernel.available() else 'NOT available'}")
    probe = torch.empty(2 * 1024**3 // 4, dtype=torch.float32, device="cuda").normal_()
    bandwidth = probe.numel() * 4 / cuda_median(probe.sum, args.repeat)
    print(f"read bandwidth (torch.sum over 2 GiB, median of {args.repeat}): {bandwidth / 1e12:.2f} TB/s")
    for dtype in (torch.float32, torch.bfloat16):
        tensors = gpt_like(args.vocab, args.width, args.layers, dtype)
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        params = sum(t.numel() for t in tensors)
        got = gpu_figures(tensors, args.rounds)
        norm_s = cuda_median(lambda tensors=tensors: torch._foreach_norm(tensors), args.repeat)
        same = torch.equal(forced("triton", tensors)(), forced("torch", tensors)())
        name = str(dtype).removeprefix("torch.")
        print(f"\n{name}: {len(tensors)} tensors, {params / 1e9:.3f} B parameters, {nbytes / 1e9:.2f} GB")
        print(f"  read floor, same blocks   {statistics.median(got['triton'].a) * 1e3:9.3f} ms (median)")
        print(f"  the same bytes at torch.sum's bandwidth {nbytes / bandwidth * 1e3:9.3f} ms (reference)")
        for label, key in (
            ("Triton, 10 back to back", "triton"),
            ("Triton, one call alone ", "triton_alone"),
            ("torch, 5 back to back  ", "torch"),
            ("torch, one call alone  ", "torch_alone"),
        ):
            seconds = statistics.median(got[key].b)
            print(f"  {label} {seconds * 1e3:9.3f} ms   floor/fingerprint {got[key].said()}")
        print(f"  torch._foreach_norm       {norm_s * 1e3:9.3f} ms   (not bit-exact; for scale)")
        print(f"  Triton == torch fallback  {same}")
        share = statistics.median(got["triton"].b) / (100 * args.step_seconds)
        print(f"  a check every 100 steps of {args.step_seconds} s: {share:.4%} of training (goal <= 0.05%)")
        del tensors
    del probe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", action="store_true", help="the CUDA part (else the CPU part)")
    parser.add_argument("--host-work", action="store_true", help="the torch fallback's host work, no GPU")
    parser.add_argument("--sizes", type=float, nargs="+", default=[5, 50], help="CPU sizes, M parameters")
    parser.add_argument("--rounds", type=int, default=paired.MIN_ROUNDS, help="paired rounds (ABBA), >= 5")
    parser.add_argument("--repeat", type=int, default=5, help="--gpu (bandwidth, foreach_norm), --host-work")
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--step-seconds", type=float, default=0.4, help="step time for the overhead line")
    args = parser.parse_args()
    if args.host_work:
        host_work(args)
    else:
        gpu(args) if args.gpu else cpu(args)


if __name__ == "__main__":
    main()
