"""The compute probe where it matters: its digest across fresh processes, with training between them, and
a negative control (issue 43, item 4).

A digest that repeats inside one process proves little: the same allocations, the same kernels picked,
the same cached plans. What the probe needs is that two *processes* holding the same state compute the
same digest (two ranks of a job are two processes), and that a rank whose arithmetic is off computes a
different one. So:

1. process A seeds a model, trains ``--steps`` steps, saves its state and the probe batch, and digests;
2. process B, fresh, loads that state and digests: it must equal A's; B then trains ``--steps`` more
   steps, saves, and digests again;
3. process C, fresh, loads B's state and digests: it must equal B's second digest;
4. process D, fresh, loads B's state with the SDC fire drill on (:mod:`ddp_trainer.sync.corruption_drill`: one
   element of the last layer's output moved as a flipped mantissa bit would) and digests: it must differ.

``--device cuda`` runs the four processes one after another on the same GPU (a one-GPU machine: no
collective, so no NCCL); ``--device cpu`` is the same on CPU, which the tests run. ``--model gpt2`` is
GPT-2 (8 x 1024, SDPA) as in ``gpu_check``; ``mlp`` a small MLP. Prints one JSON line: the digests, and
``agree`` (1 and 2 and 3 held) and ``control_differs`` (4 held).

    python bench/probe_repro.py --device cpu --model mlp --steps 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _model(kind: str, device: str, dtype: Any) -> tuple[Any, Any]:
    """(model, probe loss function) for ``kind``, seeded, on ``device``."""
    import torch

    torch.manual_seed(0)
    if kind == "gpt2":
        import transformers

        config = transformers.GPT2Config(
            vocab_size=50304, n_embd=1024, n_layer=8, n_head=16, n_positions=512, attn_implementation="sdpa"
        )
        model = transformers.GPT2LMHeadModel(config).to(device, dtype)
        ids = torch.randint(0, 50304, (8, 512), device=device)
        return model, lambda m: m(input_ids=ids, labels=ids).loss
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.GELU(),
        torch.nn.Linear(256, 256),
        torch.nn.GELU(),
        torch.nn.Linear(256, 8),
    ).to(device, dtype)
    x, y = torch.randn(32, 64, device=device, dtype=dtype), torch.randint(0, 8, (32,), device=device)
    return model, lambda m: torch.nn.functional.cross_entropy(m(x).float(), y)


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One fresh process: load (or seed), digest, maybe train and digest again, save."""
    import torch

    from ddp_trainer.sync import corruption_drill, probe

    dtype = getattr(torch, args.dtype)
    model, loss = _model(args.model, args.device, dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if args.load:
        saved = torch.load(args.load, map_location=args.device, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
    if args.drill:
        corruption_drill.install_sdc_drill(model, lambda: True)
    prober = probe.Probe(model, group=None, loss=loss)
    out: dict[str, Any] = {"device": probe.device_id(next(model.parameters()).device)}
    if args.load:
        out["loaded"] = prober.digest()
    for _ in range(args.train):
        model.train()
        loss(model).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if args.train:
        out["trained"] = prober.digest()
    if args.save:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, args.save)
    return out


def _run(args: argparse.Namespace, **flags: Any) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--worker", f"--device={args.device}", f"--model={args.model}"]
    argv += [f"--dtype={args.dtype}"]
    for key, value in flags.items():
        if value is True:
            argv.append(f"--{key}")
        elif value not in (None, False):
            argv.append(f"--{key}={value}")
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=ROOT, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The four fresh processes (module docstring); their digests and the two verdicts."""
    with tempfile.TemporaryDirectory(prefix="probe-repro-") as folder:
        first, second = Path(folder) / "a.pt", Path(folder) / "b.pt"
        a = _run(args, train=args.steps, save=first)
        b = _run(args, load=first, train=args.steps, save=second)
        c = _run(args, load=second)
        d = _run(args, load=second, drill=True)
    agree = a["trained"] == b["loaded"] and b["trained"] == c["loaded"] and a["trained"] != b["trained"]
    return {
        "device": args.device,
        "model": args.model,
        "dtype": args.dtype,
        "steps_between": args.steps,
        "processes": 4,
        "digests": {"A": a["trained"], "B_loaded": b["loaded"], "B_trained": b["trained"], "C": c["loaded"]},
        "control_digest": d["loaded"],
        "agree": agree,
        "control_differs": d["loaded"] != c["loaded"],
        "device_id": a["device"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", choices=("mlp", "gpt2"), default="mlp")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--steps", type=int, default=3, help="training steps between the digests compared")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--load", help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    parser.add_argument("--train", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--drill", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    result = measure(args)
    print(json.dumps(result))
    return 0 if result["agree"] and result["control_differs"] else 1


if __name__ == "__main__":
    sys.exit(main())
