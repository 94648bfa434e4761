"""The GPU truth in one command (``make gpu-check``): every ``gpu`` test and the GPU benchmarks, one table,
the same figures as JSON.

    make gpu-check                      # python3 with torch, Triton and transformers; no venv, no network
    python3 bench/gpu_check.py --json gpu-check.json

Parts, in order (each says how long it took; the whole is meant to stay under 5 minutes on an H100/H200):

1. ``pytest -m gpu`` over the trainer's tests (``--noconftest``: the suite's conftest starts cluster
   fixtures);
2. the fingerprint next to the HBM read floor, fp32 and bf16, on the 1.3 B-parameter GPT-like set
   (``fingerprint_bench``): GPU time per fingerprint (ten back to back between two events: the host work of
   one call overlaps the GPU work of the one before, as it does behind a training step), one call alone
   with its host work, and the pure-torch fallback measured both ways (five back to back, and alone;
   goals: Triton >= 0.8 of the floor, torch >= 0.1, GPU time per call);
3. the reference trainer vs a bare DDP loop on the same 4 x 8192 MLP, data and bf16 autocast, NCCL world
   1, whole torchrun runs of 60 and 260 steps differenced (``loop_bench``; goal >= 0.98);
4. the compute probe on a GPT-2 (8 x 1024, SDPA, batch 8 x 512) in fp32 and bf16: five digests (all equal
   is the goal), the time and peak memory of one probe beside one training step's;
5. the Hugging Face callback's cost: ``Trainer.train()`` runtime with ``SyncHealthCallback`` vs without,
   GPT-2 6 x 512, bf16, 300 steps, a check every 100 (``health_bench --gpu``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "trainer_image"), str(ROOT / "bench")]

import torch  # noqa: E402

rows: list[tuple[str, str, str]] = []
figures: dict[str, Any] = {}


def row(what: str, value: str, goal: str = "") -> None:
    rows.append((what, value, goal))
    print(f"  {what:58s} {value:>22s}  {goal}", flush=True)


def env() -> dict[str, str]:
    path = os.pathsep.join(
        [str(ROOT / "trainer_image"), str(ROOT / "bench"), os.environ.get("PYTHONPATH", "")]
    )
    return dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1")


def gpu_tests() -> None:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-o",
        "addopts=",
        "--noconftest",
        "-q",
        "-m",
        "gpu",
        "-p",
        "no:cacheprovider",
    ]
    files = [  # the files with gpu tests
        "tests/unit/trainer/sync/test_fingerprint.py",
        "tests/unit/trainer/sync/test_gpu_path.py",
        "tests/integration/trainer/test_trainer_gpu.py",
    ]
    cmd += [*files, "-o", f"pythonpath={ROOT / 'tests'}"]  # tests/helpers, as `helpers`
    done = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=400)
    tail = (done.stdout + done.stderr).strip().splitlines()
    print("\n".join(tail[-25:]))
    figures["gpu_tests"] = {"returncode": done.returncode, "summary": tail[-1] if tail else ""}
    row("pytest -m gpu", tail[-1][:40] if tail else "no output", "all pass")


def fingerprint() -> None:
    import fingerprint_bench as fb

    big = torch.empty(2 * 1024**3 // 4, dtype=torch.float32, device="cuda").normal_()
    bandwidth = big.numel() * 4 / fb.cuda_median(big.sum, 10)
    del big
    figures["read_bandwidth_tb_s"] = bandwidth / 1e12
    row("HBM read bandwidth (torch.sum, 2 GiB)", f"{bandwidth / 1e12:.2f} TB/s")
    for dtype in (torch.float32, torch.bfloat16):
        tensors = fb.gpt_like(50304, 2048, 24, dtype)
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        floor = nbytes / bandwidth
        triton = fb.forced("triton", tensors)
        back_to_back = fb.cuda_median(lambda triton=triton: [triton() for _ in range(10)], 10) / 10
        alone = fb.cuda_median(triton, 10)
        fallback = fb.forced("torch", tensors)
        torch_s = fb.cuda_median(lambda fallback=fallback: [fallback() for _ in range(5)], 3) / 5
        torch_alone = fb.cuda_median(fallback, 3)
        same = torch.equal(triton(), fb.forced("torch", tensors)())
        name = str(dtype).removeprefix("torch.")
        figures[f"fingerprint_{name}"] = {
            "gbytes": nbytes / 1e9,
            "floor_ms": floor * 1e3,
            "triton_ms": back_to_back * 1e3,
            "triton_alone_ms": alone * 1e3,
            "torch_ms": torch_s * 1e3,
            "torch_alone_ms": torch_alone * 1e3,
            "triton_equals_torch": same,
        }
        row(
            f"fingerprint {name} {nbytes / 1e9:.2f} GB: floor / Triton",
            f"{floor / back_to_back:.3f} ({back_to_back * 1e3:.3f} ms)",
            ">= 0.8",
        )
        row(
            f"fingerprint {name}: floor / Triton, one call with its host work",
            f"{floor / alone:.3f} ({alone * 1e3:.3f} ms)",
        )
        row(
            f"fingerprint {name}: floor / torch fallback",
            f"{floor / torch_s:.3f} ({torch_s * 1e3:.1f} ms)",
            ">= 0.1",
        )
        row(
            f"fingerprint {name}: floor / torch fallback, one call with its host work",
            f"{floor / torch_alone:.3f} ({torch_alone * 1e3:.1f} ms)",
        )
        row(f"fingerprint {name}: Triton == torch, bit for bit", str(same), "True")
        del tensors


def trainer_vs_bare() -> None:
    out = Path(os.environ.get("TMPDIR", "/tmp")) / "gpu-check-loop.json"
    cmd = [sys.executable, str(ROOT / "bench" / "loop_bench.py"), "--device", "cuda", "--ranks", "1"]
    cmd += ["--hidden", "8192", "--layers", "4", "--batch", "4096", "--steps", "60", "260", "--rounds", "1"]
    done = subprocess.run(
        [*cmd, "--json", str(out)], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300
    )
    print(done.stdout[-1500:], done.stderr[-1500:] if done.returncode else "")
    if done.returncode:
        row("trainer / bare DDP loop (4 x 8192 MLP, bf16)", "FAILED", ">= 0.98")
        return
    got = json.loads(out.read_text())
    figures["trainer_vs_bare"] = got
    row(
        "trainer / bare DDP loop (4 x 8192 MLP, bf16, NCCL)",
        f"{got['trainer_over_bare']:.3f} "
        f"({got['trainer_ms_per_step']:.1f} vs {got['bare_ms_per_step']:.1f} ms)",
        ">= 0.98",
    )


def probe_cost() -> None:
    for dtype in (torch.float32, torch.bfloat16):
        probe_one(dtype)


def timed(fn: Any) -> tuple[float, float]:
    """(seconds, peak GiB) of one call after a warm-up."""
    fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - started, torch.cuda.max_memory_allocated() / 2**30


def probe_one(dtype: torch.dtype) -> None:
    import transformers

    from ddp_trainer.sync import probe

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=50304, n_embd=1024, n_layer=8, n_head=16, n_positions=512, attn_implementation="sdpa"
    )
    model = transformers.GPT2LMHeadModel(config).to("cuda", dtype)
    ids = torch.randint(0, 50304, (8, 512), device="cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    prober = probe.Probe(model, group=None, loss=lambda m: m(input_ids=ids, labels=ids).loss)
    digests = [prober.digest() for _ in range(5)]
    step_s, step_gib = timed(step)
    probe_s, probe_gib = timed(prober.digest)
    name = str(dtype).removeprefix("torch.")
    figures[f"probe_{name}"] = {
        "distinct_digests": len(set(digests)),
        "probe_s": probe_s,
        "probe_peak_gib": probe_gib,
        "step_s": step_s,
        "step_peak_gib": step_gib,
    }
    row(f"probe GPT-2 8x1024 {name}: distinct digests of 5", str(len(set(digests))), "1")
    cost = f"{probe_s * 1e3:.0f} ms {probe_gib:.1f} GiB ({step_s * 1e3:.0f} ms {step_gib:.1f})"
    row(f"probe {name}: time, peak memory (one training step)", cost)


def hf_callback() -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "health_bench.py"), "--gpu"]
    done = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    print(done.stdout[-1500:], done.stderr[-2500:] if done.returncode else "")
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("GPU callback cost")]
    if done.returncode or not line:
        row("HF Trainer + SyncHealthCallback vs bare", "FAILED", "<= 2 %")
        return
    got = json.loads(line[-1].split(" ", 3)[3])
    figures["hf_callback"] = got
    row(
        "HF Trainer + SyncHealthCallback vs bare (runtime)",
        f"{got['overhead_pct']:+.2f} % ({got['with_s']:.2f} vs {got['bare_s']:.2f} s)",
        "<= 2 %",
    )
    bare, with_ = got.get("bare") or {}, got.get("with") or {}
    if bare.get("between_ms") and with_.get("between_ms"):  # where the difference is (health_bench.diagnose)
        row(
            "HF callback: median step between checks, with vs bare",
            f"{with_['between_ms']:.2f} vs {bare['between_ms']:.2f} ms; "
            f"{with_.get('syncs_between_checks')} syncs in the callback between checks",
        )
        row(
            "HF callback: start-up, check steps (ms), time in its on_step_end at them",
            f"{with_['start_s']:.2f} vs {bare['start_s']:.2f} s; {with_['check_steps_ms']}; "
            f"{with_.get('callback_check_ms')}",
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default="gpu-check.json")
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["tests", "fingerprint", "loop", "probe", "hf"]
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu-check: torch.cuda.is_available() is False: run it on a GPU machine")
    figures["device"], figures["torch"] = torch.cuda.get_device_name(), torch.__version__
    figures["date"] = time.strftime("%Y-%m-%d")
    print(f"{figures['device']}; torch {torch.__version__}; {figures['date']}", flush=True)
    parts = {
        "tests": gpu_tests,
        "fingerprint": fingerprint,
        "loop": trainer_vs_bare,
        "probe": probe_cost,
        "hf": hf_callback,
    }
    for name, part in parts.items():
        if name in args.skip:
            continue
        started = time.perf_counter()
        try:
            part()
        except Exception as error:  # one part failing still prints the others
            row(f"{name}", f"ERROR {type(error).__name__}: {str(error)[:60]}")
        figures.setdefault("seconds", {})[name] = round(time.perf_counter() - started, 1)
        torch.cuda.empty_cache()
    print("\n" + "\n".join(f"| {w} | {v} | {g} |" for w, v, g in rows))
    Path(args.json).write_text(json.dumps(figures, indent=1))
    print(f"\nwritten: {args.json}; seconds per part: {figures.get('seconds')}")


if __name__ == "__main__":
    main()
