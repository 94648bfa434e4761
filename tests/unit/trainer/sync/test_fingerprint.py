"""The fingerprint: a pure, positional function of raw bits, dtype and shape.

Checked bit for bit against an independent NumPy reference of the documented formula, on the pure-torch
path, on the Triton kernel (run by Triton's interpreter on the CPU, in a subprocess) and, where there is
a GPU, on CUDA.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ddp_trainer import sync
from ddp_trainer.sync import fingerprints
from ddp_trainer.sync.fingerprints import dispatch, numba_kernel, numpy_kernel
from ddp_trainer.train.model import MLP
from testcluster.ci import skip_or_fail

# --- the reference: the formula of fingerprint/definition.py's docstring, written again in NumPy ----
U64 = np.uint64
LANES_PER_BLOCK = 1 << 16
REF_G, REF_H = 0x9E3779B97F4A7C15, 0xD1B54A32D192ED03
CODES = [
    *("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"),
    *("complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"),
    *("float8_e8m0fnu", "uint16", "uint32", "uint64", "complex32"),
]


def splitmix_final(z: np.ndarray) -> np.ndarray:
    z = z.astype(U64)
    with np.errstate(over="ignore"):
        z ^= z >> U64(30)
        z *= U64(0xBF58476D1CE4E5B9)
        z ^= z >> U64(27)
        z *= U64(0x94D049BB133111EB)
        z ^= z >> U64(31)
    return z


def one(x: int) -> int:
    return int(splitmix_final(np.array([x % 2**64], dtype=U64))[0])


def reference(t: torch.Tensor) -> int:
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    raw += b"\0" * (-len(raw) % 8)
    lanes = np.frombuffer(raw, dtype="<u8")
    index = np.arange(lanes.size, dtype=U64)
    nblocks = -(-lanes.size // LANES_PER_BLOCK)
    with np.errstate(over="ignore"):
        terms = splitmix_final(lanes + (index % U64(LANES_PER_BLOCK) + U64(1)) * U64(REF_G))
        sums = np.zeros(nblocks, dtype=U64)
        np.add.at(sums, (index // U64(LANES_PER_BLOCK)).astype(np.int64), terms)
        blocks = splitmix_final(sums + (np.arange(nblocks, dtype=U64) + U64(1)) * U64(REF_H))
        data = int(blocks.sum(dtype=U64)) if nblocks else 0
    meta = 0
    for x in (CODES.index(str(t.dtype).removeprefix("torch.")) + 1, t.dim(), *t.shape):
        meta = one(meta + REF_G + x)
    result = one(data + meta)
    return result - 2**64 if result >= 2**63 else result


# --- samples -----------------------------------------------------------------------------------------
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]
FLOAT8 = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]
ALL = [*FLOATS, *INTS, torch.bool, torch.complex64, torch.complex128, *FLOAT8]


def sample(dtype: torch.dtype, n: int = 1000, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(n, generator=gen) > 0.5
    if dtype.is_complex:
        return torch.randn(n, generator=gen, dtype=dtype) * 3
    if dtype.is_floating_point:
        return (torch.randn(n, generator=gen) * 3).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -(2**40)), min(info.max, 2**40), (n,), generator=gen, dtype=dtype)


def fp(t: torch.Tensor) -> int:
    return int(sync.fingerprint_tensors([t])[0])


# --- the CPU paths against the reference ---------------------------------------------------------------
@pytest.mark.parametrize("dtype", ALL, ids=str)
@pytest.mark.parametrize("n", [1, 3, 777])
def test_numpy_and_torch_paths_match_the_reference(dtype: torch.dtype, n: int) -> None:
    t = sample(dtype, n)
    expected = reference(t)
    assert fp(t) == fingerprints.numpy_fingerprint(t) == int(fingerprints.torch_fingerprint(t)) == expected
    assert fingerprints.numpy_fingerprint(t, compiled=True) == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_matches_the_reference_across_blocks(dtype: torch.dtype) -> None:
    assert fingerprints.BLOCK == LANES_PER_BLOCK
    size = torch.empty(0, dtype=dtype).element_size()
    t = sample(dtype, (2 * LANES_PER_BLOCK + 3) * 8 // size + 1)  # three blocks, and a partial lane
    assert fp(t) == int(fingerprints.torch_fingerprint(t)) == reference(t)
    assert (
        fingerprints.numpy_fingerprint(t) == fingerprints.numpy_fingerprint(t, compiled=True) == reference(t)
    )
    square = sample(dtype, 4 * LANES_PER_BLOCK * 8 // size).view(4, -1)  # exactly four blocks
    assert fp(square) == int(fingerprints.torch_fingerprint(square)) == reference(square)


def test_the_cpu_default_is_numba_else_numpy_and_both_can_be_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DDPJOB_FINGERPRINT_IMPL", raising=False)
    assert numba_kernel.available()  # a dependency of the trainer: the default path is the fast one
    assert fingerprints.impl_for(torch.device("cpu")) == "numba"
    monkeypatch.setattr(numba_kernel, "available", lambda: False)
    assert fingerprints.impl_for(torch.device("cpu")) == "numpy"
    monkeypatch.setenv("DDPJOB_FINGERPRINT_IMPL", "numba")
    assert fingerprints.impl_for(torch.device("cpu")) == "numba"
    monkeypatch.setenv("DDPJOB_FINGERPRINT_IMPL", "numpy")
    assert fingerprints.impl_for(torch.device("cpu")) == "numpy"


def test_a_small_cuda_call_takes_the_torch_path_and_never_imports_triton() -> None:
    """Triton's first kernel in a process costs its import and a hash of its 500 MB library (0.5-1.5 s);
    below TRITON_MIN_BYTES a CUDA call takes the torch path, decided before Triton is looked for, unless
    Triton is forced. Asked in a fresh process of this CPU machine: nothing touches a GPU."""
    code = textwrap.dedent(
        """
        import os, sys, torch
        from ddp_trainer.sync.fingerprints import dispatch
        cuda, small, large = torch.device("cuda", 0), 4 << 20, dispatch.TRITON_MIN_BYTES
        print(dispatch.impl_for(cuda, small), dispatch.impl_for(cuda))
        print(dispatch.impl_for(cuda, large), "triton" in sys.modules)
        os.environ["DDPJOB_FINGERPRINT_IMPL"] = "triton"
        print(dispatch.impl_for(cuda, small))
        os.environ["DDPJOB_FINGERPRINT_IMPL"] = "torch"
        print(dispatch.impl_for(cuda, large))
        os.environ["DDPJOB_FINGERPRINT_IMPL"] = "cuda"
        try:
            dispatch.impl_for(cuda, small)
        except ValueError as error:
            print(str(error).split(":")[0])
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "DDPJOB_FINGERPRINT_IMPL"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "torch triton",  # a small call; the label (ddp_info's): what a large one gets
        "triton False",  # Triton is installed here, and still not imported
        "triton",
        "torch",
        "DDPJOB_FINGERPRINT_IMPL='cuda'",  # a bad value is refused whatever the size
    ]


def test_small_cpu_tensors_never_load_numba_and_large_ones_do() -> None:
    """A GPU job's checks fingerprint only a few CPU scalars (control state, the structure hash): they take
    the NumPy path, so the process never pays Numba's import and kernel load (0.4-0.8 s, measured); a CPU
    model's parameters, past COMPILED_MIN_BYTES, still take Numba. The same bits either way."""
    code = textwrap.dedent(
        """
        import sys, torch
        from ddp_trainer.sync.fingerprints import dispatch, fingerprint_tensors
        from ddp_trainer.sync.fingerprints.numpy_kernel import fingerprint as numpy_fp
        small = [torch.tensor(7), torch.tensor(1.0, dtype=torch.float64), torch.zeros(300, dtype=torch.uint8)]
        got = fingerprint_tensors(small).tolist()
        assert got == [numpy_fp(t) for t in small], got
        assert dispatch.impl_for(torch.device("cpu")) == "numba"  # the label: Numba is there, for big ones
        print("numba" in sys.modules)
        big = torch.arange(dispatch.COMPILED_MIN_BYTES // 4, dtype=torch.float32)
        assert fingerprint_tensors([big]).tolist() == [numpy_fp(big)]
        print("numba" in sys.modules)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "DDPJOB_FINGERPRINT_IMPL"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]


def test_the_kernels_import_only_the_definition() -> None:
    """The layers of the package: kernels below (each on the hash's definition alone, the torch path also on
    its plan), dispatch above."""
    package = Path(fingerprints.__file__).parent
    for kernel in ("numpy_kernel", "numba_kernel", "torch_kernel", "torch_plan", "triton_kernel"):
        tree = ast.parse((package / f"{kernel}.py").read_text())
        ours = {
            node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ddp_trainer")
        }
        ours |= {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
            if alias.name.startswith("ddp_trainer")
        }
        plan = {"ddp_trainer.sync.fingerprints.torch_plan"} if kernel == "torch_kernel" else set()
        assert ours == {"ddp_trainer.sync.fingerprints.definition", *plan}, (kernel, ours)


def test_uint_and_other_dtypes_without_arithmetic_match_too() -> None:
    base = torch.arange(-500, 500, dtype=torch.int64)
    for name in ("uint16", "uint32", "uint64"):
        if hasattr(torch, name):
            t = base.view(getattr(torch, name))
            assert fp(t) == reference(t)


def test_views_at_odd_offsets_and_strides_hash_their_logical_order() -> None:
    x = sample(torch.bfloat16, 4001)
    for offset in range(1, 6):  # data pointers 2, 4, 6, 8 ... bytes past an 8-byte boundary
        view = x[offset : offset + 3001]
        assert fp(view) == int(fingerprints.torch_fingerprint(view)) == reference(view) == fp(view.clone())
    w = sample(torch.float32, 64 * 48).view(64, 48)
    assert fp(w.t()) == reference(w.t()) == fp(w.t().contiguous())
    assert fp(w[:, ::3]) == fp(w[:, ::3].contiguous())


def test_empty_tensors_differ_by_dtype_and_shape_only() -> None:
    assert fp(torch.zeros(0)) == reference(torch.zeros(0)) == fp(torch.zeros(0))
    assert fp(torch.zeros(0)) != fp(torch.zeros(0, dtype=torch.int32))
    assert fp(torch.zeros(0)) != fp(torch.zeros(0, 3))
    assert fp(torch.zeros(0)) != fp(torch.zeros(()))


# --- what it detects -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("index", [0, 1, 2, 500, 998, 999])
def test_one_ulp_changes_it(dtype: torch.dtype, index: int) -> None:
    t = sample(dtype)
    u = t.clone()
    u[index] = torch.nextafter(t[index], torch.tensor(float("inf"), dtype=dtype))
    assert u[index] != t[index]
    assert fp(u) != fp(t)


def test_every_single_bit_flip_changes_it() -> None:
    t = sample(torch.float32, 40)
    before = fp(t)
    bits = t.view(torch.int32)
    seen = {before}
    for i in (0, 1, 17, 39):
        for bit in range(32):
            u = bits.clone()
            u[i] ^= torch.tensor(1 << bit if bit < 31 else -(2**31), dtype=torch.int32)
            seen.add(fp(u.view(torch.float32)))
    assert len(seen) == 1 + 4 * 32  # all different from each other, too


@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_swapping_two_values_changes_it(dtype: torch.dtype) -> None:
    t = sample(dtype)
    u8 = t.view(torch.uint8).view(t.numel(), -1)
    for i, j in ((3, 4), (3, 500), (0, 999)):
        if torch.equal(u8[i], u8[j]):
            continue
        u = t.clone()
        u[i], u[j] = t[j], t[i]
        assert fp(u) != fp(t), (i, j)


def test_sign_swaps_and_negation_change_it() -> None:
    t = sample(torch.float32, 1024)
    for i, j in ((0, 1), (2, 3), (10, 700)):
        u = t.clone()
        u[i], u[j] = -t[i], -t[j]  # only sign bits differ, in the low and high halves of a lane
        assert fp(u) != fp(t)
    assert fp(-t) != fp(t)


def test_swapping_lanes_that_differ_only_in_a_sign_bit_changes_it() -> None:
    # A weak mixer (one multiply, one xor-shift) misses about half of these: the difference stays in
    # two bits. Twenty independent pairs make such a mixer fail here with probability 1 - 2**-20.
    gen = torch.Generator().manual_seed(7)
    base = torch.randn(4000, generator=gen)
    lanes = torch.randperm(2000, generator=gen)[:40].view(20, 2).tolist()
    for i, j in lanes:
        t = base.clone()
        t[2 * j], t[2 * j + 1] = t[2 * i], -t[2 * i + 1]  # lane j = lane i with the upper float negated
        u = t.clone()
        u[2 * i : 2 * i + 2], u[2 * j : 2 * j + 2] = t[2 * j : 2 * j + 2], t[2 * i : 2 * i + 2]
        assert not torch.equal(u, t)
        assert fp(u) != fp(t), (i, j)


def test_transposes_and_permutations_change_it() -> None:
    w = torch.randn(64, 64)
    assert fp(w.t().contiguous()) != fp(w)
    assert fp(w.flip(0)) != fp(w)
    assert fp(w.roll(1)) != fp(w)
    sym = w + w.t()  # a transpose that changes nothing is, correctly, the same data
    assert fp(sym.t().contiguous()) == fp(sym)
    big = torch.randn(512, 300)  # spans blocks: 153,600 floats = 76,800 lanes
    assert fp(big.t().contiguous().view(512, 300)) != fp(big)


def test_length_dtype_and_shape_are_folded_in() -> None:
    assert fp(torch.tensor([1.0])) != fp(torch.tensor([1.0, 0.0]))  # same padded lane
    assert fp(torch.tensor([1.5])) != fp(torch.tensor([1.5]).view(torch.int32))
    assert fp(torch.zeros(2, 3)) != fp(torch.zeros(3, 2)) != fp(torch.zeros(6))
    assert fp(torch.tensor([0.0])) != fp(torch.tensor([-0.0]))
    nan_a = torch.tensor([0x7FC00000], dtype=torch.int32).view(torch.float32)
    nan_b = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    assert fp(nan_a) != fp(nan_b)


def test_block_boundary_positions_are_distinguished() -> None:
    t = torch.zeros(2 * LANES_PER_BLOCK * 2, dtype=torch.float32)  # two full blocks
    a, b = t.clone(), t.clone()
    a[0] = 1.0  # lane 0 of block 0
    b[2 * LANES_PER_BLOCK] = 1.0  # lane 0 of block 1
    assert len({fp(t), fp(a), fp(b)}) == 3


def test_forcing_an_unknown_implementation_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDPJOB_FINGERPRINT_IMPL", "fast")
    with pytest.raises(ValueError, match="DDPJOB_FINGERPRINT_IMPL"):
        fp(torch.zeros(3))
    for impl in ("torch", "numpy", "NumPy ", "numba"):
        monkeypatch.setenv("DDPJOB_FINGERPRINT_IMPL", impl)
        assert fp(torch.zeros(3)) == reference(torch.zeros(3))


def test_deterministic_and_one_entry_per_parameter_and_buffer() -> None:
    torch.manual_seed(3)
    a = MLP()
    torch.manual_seed(3)
    b = MLP()
    vector = sync.fingerprint(a)
    assert vector.dtype == torch.int64
    assert len(vector) == len(list(a.parameters())) + len(list(a.buffers())) == 11
    assert vector.tolist() == [reference(t) for _, t in sync.named_tensors(a)]
    assert torch.equal(vector, sync.fingerprint(b))
    assert len(sync.fingerprint(a, buffers=False)) == 8
    with torch.no_grad():
        b.net[1].running_var[0] += 1
    changed = (sync.fingerprint(b) != vector).nonzero().flatten().tolist()
    assert [sync.named_tensors(b)[i][0] for i in changed] == ["net.1.running_var"]


# --- the Triton kernel, run by Triton's interpreter on the CPU ------------------------------------------
TRITON_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from ddp_trainer.sync import fingerprints
    from ddp_trainer.sync.fingerprints import triton_kernel
    sys.path.insert(0, sys.argv[1])
    from test_fingerprint import ALL, reference, sample
    tensors = [sample(d, n, seed=n) for d in ALL for n in (1, 5, 333)]
    tensors += [sample(torch.float32, 2 * 65536 * 2 + 7), sample(torch.bfloat16, 4001)[3:3000]]
    tensors += [torch.zeros(0), torch.randn(40, 30).t(), torch.tensor(2.5)]
    tensors += [sample(torch.float64, 1500), sample(torch.float32, 2 * 1500 + 1)]  # a tile and a part
    kernel = triton_kernel.fingerprint_tensors(tensors).tolist()
    torch_path = [int(fingerprints.torch_fingerprint(t)) for t in tensors]
    numpy_path = [fingerprints.numpy_fingerprint(t) for t in tensors]
    refs = [reference(t) for t in tensors]
    print(json.dumps({"kernel": kernel, "torch": torch_path, "numpy": numpy_path, "reference": refs,
                      "n": len(tensors)}))
    """
)


def _interpreted(script: str) -> dict[str, Any]:
    """``script``'s JSON result, run under Triton's interpreter (``TRITON_INTERPRET=1``: the kernels on CPU
    tensors) in a fresh process; skipped, saying why, where Triton does not import."""
    try:
        import triton  # noqa: F401
    except ImportError as error:
        skip_or_fail(f"triton is not importable (torch's CUDA wheels bring it): {error}")
    done = subprocess.run(
        [sys.executable, "-c", script, str(Path(__file__).parent)],
        env=dict(os.environ, TRITON_INTERPRET="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_triton_kernel_matches_under_the_interpreter(tmp_path: Path) -> None:
    result = _interpreted(TRITON_SCRIPT)
    assert result["n"] == len(ALL) * 3 + 7
    assert result["kernel"] == result["torch"] == result["numpy"] == result["reference"]


READ_FLOOR_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import torch
    from ddp_trainer.sync.fingerprints import triton_kernel
    from ddp_trainer.sync.fingerprints.definition import BLOCK, byte_view
    sys.path.insert(0, sys.argv[1])
    from test_fingerprint import sample
    tensors = [sample(torch.float32, 2 * 65536 * 2 + 7), sample(torch.bfloat16, 4001)[3:3000]]
    tensors += [sample(torch.float64, 1500), torch.tensor(2.5), sample(torch.int8, 13)]
    got = triton_kernel.read_blocks(tensors).tolist()
    want = []
    for t in tensors:  # each block's bytes as little-endian 64-bit lanes (the last zero-padded), summed
        data = byte_view(t).numpy().tobytes()
        for start in range(0, len(data), 8 * BLOCK):
            chunk = data[start:start + 8 * BLOCK]
            chunk += bytes(-len(chunk) % 8)
            total = int(np.frombuffer(chunk, dtype="<u8").sum(dtype=np.uint64))
            want.append(total - (1 << 64) if total >= 1 << 63 else total)
    print(json.dumps({"kernel": got, "numpy": want}))
    """
)


def test_the_read_floor_reads_exactly_the_fingerprints_blocks_under_the_interpreter() -> None:
    """The bench's fair floor (issue 43, item 3) reads the same block table, every byte once: its block sums
    equal numpy's over the same bytes, misaligned views and partial lanes included."""
    result = _interpreted(READ_FLOOR_SCRIPT)
    assert result["kernel"] == result["numpy"] and len(result["kernel"]) > 5, result


# --- CUDA ----------------------------------------------------------------------------------------------
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="torch.cuda.is_available() is False: no CUDA device"
)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("impl", ["torch", "triton", ""])
def test_cuda_equals_cpu(impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDPJOB_FINGERPRINT_IMPL", impl)
    tensors = [sample(d, n) for d in ALL for n in (1, 5, 777)]
    tensors += [sample(torch.float32, 3 * 65536 + 5), sample(torch.bfloat16, 4001)[3:3000]]
    tensors += [torch.zeros(0), torch.randn(40, 30).t(), torch.tensor(2.5)]
    expected = [reference(t) for t in tensors]
    on_gpu = [t.cuda() for t in tensors]
    assert sync.fingerprint_tensors(on_gpu).cpu().tolist() == expected
    if impl:  # the kernel asked for ran: a failing Triton kernel would fall back to torch and pass unseen
        assert fingerprints.impl_for(on_gpu[0].device) == impl
    if impl == "torch":  # and through its fused kernel: one that fails to build falls back to eager ops
        from ddp_trainer.sync.fingerprints import torch_kernel

        assert torch_kernel._fused() is not None, "torch's jiterator did not build the fused mixer"
    contiguous = [t for t in on_gpu if t.is_contiguous()]
    first = sync.fingerprint_tensors(contiguous)  # builds (and uploads) the kernel's tables once
    torch.cuda.set_sync_debug_mode("error")  # the next call reads nothing back to the host
    try:
        again = sync.fingerprint_tensors(contiguous)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(first, again)
    assert again.cpu().tolist() == [e for e, t in zip(expected, tensors, strict=True) if t.is_contiguous()]


@pytest.mark.gpu
@needs_cuda
def test_on_a_gpu_a_small_model_takes_torch_without_triton_and_a_large_one_triton() -> None:
    code = textwrap.dedent(
        """
        import sys, torch
        from ddp_trainer.sync.fingerprints import dispatch, fingerprint_tensors, torch_kernel
        small = [torch.randn(1000, 1000, device="cuda"), torch.tensor(2.0, device="cuda")]
        got = fingerprint_tensors(small).tolist()
        assert got == torch_kernel.fingerprint_many([t.cpu() for t in small]).tolist(), got
        print("triton" in sys.modules)
        large = [torch.randn(dispatch.TRITON_MIN_BYTES // 4, device="cuda")]
        assert fingerprint_tensors(large).tolist() == torch_kernel.fingerprint_many(large).tolist()
        print("triton" in sys.modules, dispatch.impl_for(torch.device("cuda")))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "DDPJOB_FINGERPRINT_IMPL"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["False", "True triton"]


def test_numba_without_a_writable_cache_compiles_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only image run as another user has nowhere to cache the compiled kernel: still the same bits."""
    from numba.core import caching

    monkeypatch.setattr(caching.CacheImpl, "_locator_classes", [])
    kernel = numba_kernel._kernel.__wrapped__()
    assert type(kernel._cache).__name__ == "NullCache"  # not cached, and not refused
    t = sample(torch.float32, 3 * LANES_PER_BLOCK + 5)
    lanes = numpy_kernel._np_lanes(t)
    keys = np.arange(1, LANES_PER_BLOCK + 1, dtype=np.uint64) * np.uint64(fingerprints.G)
    out = np.zeros(-(-lanes.size // LANES_PER_BLOCK), dtype=np.uint64)
    kernel(lanes, keys, out)
    assert np.array_equal(out, numba_kernel.block_sums(lanes, keys, out.size))


# --- the fallback from a compiled kernel that fails --------------------------------------------------------
@pytest.fixture
def fresh_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """No kernel retired and nothing said yet in this process (the dispatcher's state is per process)."""
    monkeypatch.setattr(dispatch, "_broken", {})
    monkeypatch.setattr(dispatch, "_said", set())


def fallback_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == dispatch.__name__]


@pytest.mark.usefixtures("fresh_dispatch")
def test_a_triton_kernel_that_fails_falls_back_to_torch_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from ddp_trainer.sync.fingerprints import triton_kernel

    def launch(tensors: list[torch.Tensor]) -> torch.Tensor:
        raise RuntimeError("PassManager::run failed")  # what a Triton build error looks like

    monkeypatch.setattr(triton_kernel, "available", lambda: True)  # as on a CUDA machine
    monkeypatch.setattr(triton_kernel, "fingerprint_tensors", launch)
    monkeypatch.setenv("DDPJOB_FINGERPRINT_IMPL", "triton")  # CPU tensors reach the Triton path
    assert fingerprints.impl_for(torch.device("cpu")) == "triton"
    tensors = [sample(torch.float32, 777), sample(torch.bfloat16, 5)]
    assert sync.fingerprint_tensors(tensors).tolist() == [reference(t) for t in tensors]
    assert fingerprints.impl_for(torch.device("cpu")) == "torch"  # for the rest of the process
    assert fp(tensors[0]) == reference(tensors[0])
    lines = fallback_lines(caplog)
    assert len(lines) == 1, lines
    assert (
        "triton kernel failed" in lines[0] and "PassManager::run failed" in lines[0] and "torch" in lines[0]
    )


@pytest.mark.usefixtures("fresh_dispatch")
def test_a_numba_kernel_that_fails_falls_back_to_numpy(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def compile_error(lanes: np.ndarray, keys: np.ndarray, blocks: int) -> np.ndarray:
        raise TypeError("No matching definition for argument type(s)")

    monkeypatch.delenv("DDPJOB_FINGERPRINT_IMPL", raising=False)
    monkeypatch.setattr(numba_kernel, "block_sums", compile_error)
    assert fingerprints.impl_for(torch.device("cpu")) == "numba"
    t = sample(torch.float16, dispatch.COMPILED_MIN_BYTES // 2 + 999)  # large enough for Numba
    assert fp(t) == fp(t) == reference(t)
    assert fingerprints.impl_for(torch.device("cpu")) == "numpy"
    assert len(fallback_lines(caplog)) == 1


@pytest.mark.usefixtures("fresh_dispatch")
def test_a_failure_of_a_plain_path_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(tensors: list[torch.Tensor]) -> torch.Tensor:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setenv("DDPJOB_FINGERPRINT_IMPL", "torch")
    monkeypatch.setattr(fingerprints.dispatch.torch_kernel, "fingerprint_many", broken)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        fp(torch.zeros(3))


@pytest.mark.usefixtures("fresh_dispatch")
def test_cuda_without_triton_uses_torch_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from ddp_trainer.sync.fingerprints import triton_kernel

    monkeypatch.delenv("DDPJOB_FINGERPRINT_IMPL", raising=False)
    monkeypatch.setattr(triton_kernel, "available", lambda: False)
    cuda = torch.device("cuda", 0)  # impl_for only reads the device's type: no GPU is touched
    assert fingerprints.impl_for(cuda) == fingerprints.impl_for(cuda) == "torch"
    lines = fallback_lines(caplog)
    assert len(lines) == 1 and "no Triton kernel" in lines[0], lines


@pytest.mark.parametrize("rows", [3, 8, 64])
def test_the_torch_path_takes_many_tensors_at_once_across_chunks(
    monkeypatch: pytest.MonkeyPatch, rows: int
) -> None:
    """One call over tensors that straddle chunks (``rows`` blocks a chunk), large ones read in place and
    small ones gathered, misaligned views, partial lanes and empty tensors gives each tensor its own
    reference fingerprint."""
    from ddp_trainer.sync.fingerprints import torch_kernel, torch_plan

    monkeypatch.setitem(torch_plan.CHUNK_BYTES, "cpu", rows * 8 * LANES_PER_BLOCK)
    tensors = [sample(torch.float32, 5 * LANES_PER_BLOCK + 3), sample(torch.bfloat16, 7)]  # 2.5 blocks
    tensors += [sample(torch.float64, 2 * LANES_PER_BLOCK), sample(torch.uint8, 8 * LANES_PER_BLOCK + 1)[1:]]
    tensors += [sample(torch.float32, 18 * LANES_PER_BLOCK + 5, seed=1)]  # 9 whole blocks and a partial one
    tensors += [torch.zeros(0), sample(torch.int16, 3 * LANES_PER_BLOCK + 1), torch.tensor(True)]
    before = [t.clone() for t in tensors]
    geometry = torch_plan.geometry_for(tensors, torch.device("cpu"))
    direct = [c.rows for c in geometry.chunks if c.direct]
    # a tensor's whole blocks go in place when they fill a quarter chunk, in chunks of even size
    assert direct == {3: [2, 2, 3, 3, 3], 8: [2, 2, 5, 4], 64: []}[rows], direct
    assert max(c.rows for c in geometry.chunks) <= rows
    assert (geometry.order is None) == (not direct)
    got = torch_kernel.fingerprint_many(tensors).tolist()
    assert got == [reference(t) for t in tensors]
    assert torch_kernel.fingerprint_many(tensors).tolist() == got  # again, from the cached geometry
    assert all(t.equal(u) for t, u in zip(tensors, before, strict=True))  # read in place, never written
