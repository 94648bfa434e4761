"""fingerprint(): a pure, positional function of raw bits (checked against an independent reference)."""

from __future__ import annotations

import pytest
import torch

from ddp_trainer import sync
from ddp_trainer.model import MLP

P = 2**31 - 1
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def reference(t: torch.Tensor) -> int:
    """The documented formula in plain Python: 16-bit little-endian limbs, two polynomial hashes mod P."""
    raw = t.contiguous().reshape(-1).view(torch.uint8).tolist()
    limbs = raw if t.element_size() == 1 else [raw[i] | raw[i + 1] << 8 for i in range(0, len(raw), 2)]
    hashes = []
    for r, rho in sync._HASHES:
        h = 0
        for i, v in enumerate(limbs):
            h = (h + v * pow(r, i % sync._ROW, P) * pow(rho, i // sync._ROW, P)) % P
        code = list(sync._DTYPE_CODES).index(t.dtype) + 1
        hashes.append((h * 65599 + (t.numel() * 64 + code) % P) % P)
    return hashes[0] * 2**31 + hashes[1]


def fp(t: torch.Tensor) -> int:
    return int(sync.fingerprint_tensors([t])[0])


def sample(dtype: torch.dtype, n: int = 1000, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(n, generator=gen) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(n, generator=gen) * 3).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -(2**40)), min(info.max, 2**40), (n,), generator=gen, dtype=dtype)


ALL = [*FLOATS, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]


@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_matches_the_reference_formula(dtype: torch.dtype) -> None:
    t = sample(dtype, 777)
    assert fp(t) == reference(t)
    assert 0 <= fp(t) < 2**62


def test_matches_the_reference_across_rows() -> None:
    t = sample(torch.int16, sync._ROW + 4321)  # two rows of limbs, the second partial
    assert fp(t) == reference(t)


def test_block_size_does_not_change_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    t = sample(torch.float32, 3 * sync._BLOCK // 2 + 11)  # spans blocks at the default size too
    expected = fp(t)
    for block in (sync._ROW, 3 * sync._ROW):
        monkeypatch.setattr(sync, "_BLOCK", block)
        assert fp(t) == expected


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("index", [0, 500, 999])
def test_one_ulp_changes_it(dtype: torch.dtype, index: int) -> None:
    t = sample(dtype)
    u = t.clone()
    u[index] = torch.nextafter(t[index], torch.tensor(float("inf"), dtype=dtype))
    assert u[index] != t[index]
    assert fp(u) != fp(t)


@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_swapping_two_values_changes_it(dtype: torch.dtype) -> None:
    t = sample(dtype)
    i, j = 3, 3 + int(torch.nonzero(t[4:] != t[3])[0]) + 1  # two different values
    u = t.clone()
    u[i], u[j] = t[j], t[i]
    assert sorted(u.tolist()) == sorted(t.tolist())  # same values, same sum: only the order differs
    assert fp(u) != fp(t)


def test_transposed_matrix_changes_it_but_a_view_does_not() -> None:
    w = torch.randn(64, 64)
    assert fp(w.t().contiguous()) != fp(w)
    assert fp(w.t()) == fp(w.t().contiguous())  # logical order, whatever the strides


def test_special_values_and_shapes() -> None:
    assert fp(torch.tensor([0.0])) != fp(torch.tensor([-0.0]))
    nan_a = torch.tensor([0x7FC00000], dtype=torch.int32).view(torch.float32)
    nan_b = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    assert fp(nan_a) != fp(nan_b)
    assert fp(torch.tensor([1.0])) != fp(torch.tensor([1.0, 0.0]))
    same_bits = torch.tensor([1.5])
    assert fp(same_bits) != fp(same_bits.view(torch.int32))
    assert fp(torch.zeros(0)) == fp(torch.zeros(0))


def test_deterministic_and_one_entry_per_parameter_and_buffer() -> None:
    torch.manual_seed(3)
    a = MLP()
    torch.manual_seed(3)
    b = MLP()
    vector = sync.fingerprint(a)
    assert vector.dtype == torch.int64
    assert len(vector) == len(list(a.parameters())) + len(list(a.buffers())) == 11
    assert torch.equal(vector, sync.fingerprint(a))
    assert torch.equal(vector, sync.fingerprint(b))
    assert len(sync.fingerprint(a, buffers=False)) == 8
    with torch.no_grad():
        b.net[1].running_var[0] += 1
    changed = (sync.fingerprint(b) != vector).nonzero().flatten().tolist()
    assert [sync.named_tensors(b)[i][0] for i in changed] == ["net.1.running_var"]
