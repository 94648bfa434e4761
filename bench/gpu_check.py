"""The GPU truth in one command (``make gpu-check``): every ``gpu`` test and the GPU benchmarks, one table,
the same figures as JSON.

    make gpu-check                      # python3 with torch, Triton and transformers; no venv, no network
    python3 bench/gpu_check.py --json gpu-check.json

Every A-vs-B figure is taken one way (``bench/paired.py``): a warm-up, then at least 5 paired rounds in
ABBA order, timed inside the process (between ``torch.cuda.synchronize()`` calls or CUDA events); the table
and the JSON carry the median of the per-round ratios, their spread (min-max), the rounds and the verdict:
``met`` only when the whole spread clears the goal, ``unmet`` when none of it does, else ``unresolved``.

Parts, in order (each says how long it took; the whole was under 5 minutes on an H200 before the paired
rounds; with them, expect about 8-9 minutes, most of it the Hugging Face part's 12 whole runs):

1. ``pytest -m gpu`` over the trainer's tests (``--noconftest``: the suite's conftest starts cluster
   fixtures);
2. the fingerprint next to the HBM read floor, fp32 and bf16, on the 1.3 B-parameter GPT-like set
   (``fingerprint_bench.gpu_figures``): GPU time per fingerprint (ten back to back between two events: the
   host work of one call overlaps the GPU work of the one before, as it does behind a training step), one
   call alone with its host work, and the pure-torch fallback measured both ways (five back to back, and
   alone; goals: Triton >= 0.8 of the floor, torch >= 0.1, GPU time per call). The floor is a read of the
   same blocks: the fingerprint's first launch with the hash taken out (``triton_kernel.read_blocks``),
   timed as the figure it is the floor of and alternated with it;
3. the reference trainer vs a bare DDP loop on the same 4 x 8192 MLP, data and bf16 autocast, NCCL world
   1 (``loop_bench``; goal >= 0.98): both running at once and taking turns, windows of steps timed inside
   each; the main figure with the batches staged on the GPU (one gather from a device tensor), a second,
   labelled figure with the DataLoader building them on the host; each with how busy the GPU was (CUDA
   event time of the steps over wall time; under 90 % is flagged);
4. the compute probe on a GPT-2 (8 x 1024, SDPA, batch 8 x 512) in fp32 and bf16: the digest across four
   fresh processes on the same GPU with training steps between them, and the SDC drill's negative control
   (``probe_repro``: the fresh processes agree and the perturbed one differs is the goal), the time and
   peak memory of one probe beside one training step's;
5. the Hugging Face callback's cost: the wall time of ``Trainer.train()`` (``on_train_end`` included)
   with ``SyncHealthCallback`` vs without, GPT-2 6 x 512, bf16, 300 steps, a check every 100, one whole
   run per sample (``health_bench --gpu``; goal <= 2 %);
6. what a lost peer costs an NCCL group (``nccl_bench``): abort and re-form in one process, a worker
   killed while a kernel spins (to reaped, to its memory free), two ranks on one GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "trainer_image"), str(ROOT / "bench")]

import paired  # noqa: E402
import torch  # noqa: E402

ROUNDS = paired.MIN_ROUNDS
BUSY_FLAG = 0.9
rows: list[tuple[str, str, str, str]] = []
figures: dict[str, Any] = {}


def row(what: str, value: str, goal: str = "", verdict: str = "") -> None:
    rows.append((what, value, goal, verdict))
    print(f"  {what:58s} {value:>22s}  {goal}  {verdict}", flush=True)


def ranged(got: paired.Paired, show: Callable[[float], str] = "{:.3f}".format) -> str:
    """``median [low - high] xN`` of a figure's per-round ratios, each as ``show`` writes it."""
    median, low, high = (show(v) for v in (got.median, got.low, got.high))
    return f"{median} [{low} - {high}] x{got.rounds}"


def overhead(ratio: float) -> str:
    """A cost ratio B / A as B's overhead in per cent: 1.013 -> ``+1.30 %``."""
    return f"{100 * (ratio - 1):+.2f} %"


def goal_of(got: paired.Paired, fmt: str = "{:g}") -> str:
    if got.goal is None:
        return ""
    return (">= " if got.direction == "at least" else "<= ") + fmt.format(got.goal)


def from_json(got: dict[str, Any]) -> paired.Paired:
    """A figure back from a bench script's JSON (``Paired.as_json``)."""
    fields = {k: got[k] for k in ("median", "low", "high", "rounds", "verdict", "goal", "direction", "over")}
    return paired.Paired(**fields, ratios=tuple(got["ratios"]), a=tuple(got["a"]), b=tuple(got["b"]))


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

    probe = torch.empty(2 * 1024**3 // 4, dtype=torch.float32, device="cuda").normal_()
    bandwidth = probe.numel() * 4 / fb.cuda_median(probe.sum, 10)
    figures["read_bandwidth_tb_s"] = bandwidth / 1e12
    row("HBM read bandwidth (torch.sum, 2 GiB, median of 10)", f"{bandwidth / 1e12:.2f} TB/s")
    for dtype in (torch.float32, torch.bfloat16):
        tensors = fb.gpt_like(50304, 2048, 24, dtype)
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        got = fb.gpu_figures(tensors, ROUNDS)
        same = torch.equal(fb.forced("triton", tensors)(), fb.forced("torch", tensors)())
        name = str(dtype).removeprefix("torch.")
        ms = {key: 1e3 * statistics.median(figure.b) for key, figure in got.items()}
        figures[f"fingerprint_{name}"] = {
            "gbytes": nbytes / 1e9,
            "floor_ms": 1e3 * statistics.median(got["triton"].a),
            "floor": "read_blocks: the same block table read, no hash; timed as each figure, ABBA rounds",
            **{f"{key}_ms": value for key, value in ms.items()},
            **{f"floor_over_{key}": figure.as_json() for key, figure in got.items()},
            "triton_equals_torch": same,
        }
        for key, label in (
            ("triton", f"fingerprint {name} {nbytes / 1e9:.2f} GB: floor / Triton, 10 back to back"),
            ("triton_alone", f"fingerprint {name}: floor / Triton, one call with its host work"),
            ("torch", f"fingerprint {name}: floor / torch fallback, 5 back to back"),
            ("torch_alone", f"fingerprint {name}: floor / torch fallback, one call with its host work"),
        ):
            figure = got[key]
            verdict = figure.verdict if figure.goal is not None else ""
            row(label, f"{ranged(figure)} ({ms[key]:.3f} ms)", goal_of(figure), verdict)
        row(f"fingerprint {name}: Triton == torch, bit for bit", str(same), "True")
        del tensors
    del probe


def trainer_vs_bare() -> None:
    """The staged figure first (the main one), then the host-bound one (labelled)."""
    shape = ["--device", "cuda", "--ranks", "1", "--hidden", "8192", "--layers", "4", "--batch", "4096"]
    variants = {
        "staged": (["--data", "staged", "--steps", "60", "260"], "batches staged on the GPU"),
        "loader": (["--data", "loader", "--steps", "20", "120"], "host-bound: DataLoader batches"),
    }
    for data, (flags, label) in variants.items():
        out = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpu-check-loop-{data}.json"
        cmd = [sys.executable, str(ROOT / "bench" / "loop_bench.py"), *shape, *flags, "--rounds", str(ROUNDS)]
        what = f"trainer / bare DDP loop (4 x 8192 MLP, bf16, NCCL), {label}"
        try:
            done = subprocess.run(
                [*cmd, "--json", str(out)], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=400
            )
        except subprocess.TimeoutExpired:
            row(what, "TIMED OUT (400 s)", ">= 0.98")
            continue
        print(done.stdout[-2500:], done.stderr[-1500:] if done.returncode else "")
        if done.returncode:
            row(what, "FAILED", ">= 0.98")
            continue
        got = json.loads(out.read_text())
        figures[f"trainer_vs_bare_{data}"] = got
        figure = from_json(got["paired"])
        busy, flagged = got.get("busy") or {}, bool(got.get("busy_flagged"))
        ms = f"{got['trainer_ms_per_step']:.1f} vs {got['bare_ms_per_step']:.1f} ms"
        verdict = figure.verdict + (f"; FLAGGED: GPU under {BUSY_FLAG:.0%} busy" if flagged else "")
        row(what, f"{ranged(figure)} ({ms})", goal_of(figure), verdict)
        said = ", ".join(f"{side} {share:.0%}" for side, share in busy.items())
        row(
            f"  GPU busy, {label} (CUDA event time of the steps / wall)",
            said or "n/a",
            f">= {BUSY_FLAG:.0%}",
            "FLAGGED" if flagged else "",
        )
        row(f"  excluded ({data})", got.get("excluded", ""))


def probe_cost() -> None:
    for dtype in (torch.float32, torch.bfloat16):
        probe_one(dtype)
        torch.cuda.empty_cache()
        probe_across(dtype)


def across_processes(dtype: str) -> dict[str, Any]:
    """``probe_repro`` on this GPU: the digest across fresh processes, and the SDC drill's control."""
    cmd = [sys.executable, str(ROOT / "bench" / "probe_repro.py"), "--device=cuda", "--model=gpt2"]
    done = subprocess.run(
        [*cmd, f"--dtype={dtype}", "--steps=2"],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    lines = done.stdout.strip().splitlines()
    try:
        found: dict[str, Any] = json.loads(lines[-1])
        return found
    except (IndexError, ValueError):
        return {"error": (done.stderr or done.stdout)[-1500:]}


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
    step_s, step_gib = timed(step)
    probe_s, probe_gib = timed(prober.digest)
    name = str(dtype).removeprefix("torch.")
    figures[f"probe_{name}"] = {
        "probe_s": probe_s,
        "probe_peak_gib": probe_gib,
        "step_s": step_s,
        "step_peak_gib": step_gib,
    }
    cost = f"{probe_s * 1e3:.0f} ms {probe_gib:.1f} GiB ({step_s * 1e3:.0f} ms {step_gib:.1f})"
    row(f"probe {name}: time, peak memory (one training step)", cost)


def probe_across(dtype: torch.dtype) -> None:
    """The digest across four fresh processes on this GPU, and the SDC drill's control (probe_repro)."""
    name = str(dtype).removeprefix("torch.")
    repro = across_processes(name)
    figures[f"probe_{name}"]["across_processes"] = repro
    held = repro.get("agree") is True and repro.get("control_differs") is True
    agree = "agree" if repro.get("agree") else "DIFFER"
    control = "differs" if repro.get("control_differs") else "SAME"
    what = f"probe GPT-2 8x1024 {name}: 4 fresh processes, SDC control"
    row(what, f"{agree}, control {control}", "agree, differs", "met" if held else "unmet")


def hf_callback() -> None:
    what = "HF Trainer + SyncHealthCallback vs bare, train() incl. on_train_end"
    cmd = [sys.executable, str(ROOT / "bench" / "health_bench.py"), "--gpu", "--rounds", str(ROUNDS)]
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        row(what, "TIMED OUT (600 s)", "<= 2 %")
        return
    print(done.stdout[-1500:], done.stderr[-2500:] if done.returncode else "")
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("GPU callback cost")]
    if done.returncode or not line:
        row(what, "FAILED", "<= 2 %")
        return
    got = json.loads(line[-1].split(" ", 3)[3])
    figures["hf_callback"] = got
    figure = from_json(got["paired"])
    row(
        what,
        f"{ranged(figure, overhead)} ({got['with_s']:.2f} vs {got['bare_s']:.2f} s)",
        "<= 2 %",
        figure.verdict,
    )
    for key, label in (
        ("runtime_paired", "train_runtime (stops before on_train_end)"),
        ("steady_paired", "steady state (step 20 to the end)"),
    ):
        if key in got:
            row(f"  the same, {label}", ranged(from_json(got[key]), overhead))
    row("  excluded", got.get("excluded", ""))
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


def nccl() -> None:
    """What a lost peer costs a worker's group with NCCL (``nccl_bench.py``): abort and re-form, a kill."""
    cmd = [sys.executable, str(ROOT / "bench" / "nccl_bench.py"), "--rounds", str(ROUNDS)]
    done = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    print(done.stdout[-3000:], done.stderr[-2500:] if done.returncode else "")
    if done.returncode:
        row("nccl_bench", "FAILED")
        return
    got = json.loads(done.stdout.strip().splitlines()[-1])
    figures["nccl"] = got
    ms = "{:.1f} ms".format

    def said(figure: dict[str, Any]) -> str:
        return f"{ms(1e3 * figure['median'])} [{ms(1e3 * figure['low'])} - {ms(1e3 * figure['high'])}]"

    reform, killed = got["reform"], got["killed_in_kernel"]
    row("NCCL world 1: cold group to first all-reduce", ms(1e3 * reform["cold_group_s"]))
    row("NCCL: ProcessGroup.abort() + destroy", said(reform["abort_s"]))
    row("NCCL: re-form to first all-reduce, after an abort", said(reform["reform_to_first_allreduce_s"]))
    row("torch.distributed.shrink_group in this torch", str(reform["has_shrink_group"]))
    row("a new NCCL worker: start to ready (CUDA, group, memory)", said(killed["child_start_to_ready_s"]))
    row("SIGKILL of a worker spinning in a kernel: to reaped", said(killed["kill_to_reaped_s"]))
    if "kill_to_memory_free_s" in killed:
        row(f"  to its {killed['hold_gib']:g} GiB free again", said(killed["kill_to_memory_free_s"]))
    if "two_ranks_one_gpu" in got:
        row("NCCL: two ranks on one GPU make a communicator", str(got["two_ranks_one_gpu"]["works"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default="gpu-check.json")
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["tests", "fingerprint", "loop", "probe", "hf", "nccl"]
    )
    parser.add_argument("--only", nargs="*", default=None, help="run only these parts, in the usual order")
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
        "nccl": nccl,
    }
    for name, part in parts.items():
        if name in args.skip or (args.only is not None and name not in args.only):
            continue
        started = time.perf_counter()
        try:
            part()
        except Exception as error:  # one part failing still prints the others
            row(f"{name}", f"ERROR {type(error).__name__}: {str(error)[:60]}")
        figures.setdefault("seconds", {})[name] = round(time.perf_counter() - started, 1)
        torch.cuda.empty_cache()
        Path(args.json).write_text(json.dumps(figures, indent=1))  # a run cut short keeps its parts
    table = [("what", "figure", "goal", "verdict"), ("---", "---:", "---", "---"), *rows]
    print("\n" + "\n".join(f"| {w} | {v} | {g} | {d} |" for w, v, g, d in table))
    Path(args.json).write_text(json.dumps(figures, indent=1))
    print(f"\nwritten: {args.json}; seconds per part: {figures.get('seconds')}")


if __name__ == "__main__":
    main()
