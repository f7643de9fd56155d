"""Projections of a few rows (norm, residual, SiLU-mul, rotary and the KV write folded in) against
the eager ops."""
from __future__ import annotations

import pytest
import torch

from deepinfer_kernels import (
    RowsConfig,
    gemv,
    gemv_qkv_rotary_ref,
    gemv_ref,
    gemv_rows,
    gemv_rows_qkv_rotary,
    gemv_rows_qkv_rotary_ref,
    gemv_rows_ref,
)
from tests.kernels.paged import DTYPES, TOL, randn

#: a tile of 16 rows by 16 columns (K = 40: a ragged last step) and one wider than N and K
CONFIGS = [RowsConfig(16, 16), RowsConfig(32, 64, num_warps=2)]
ROWS = [1, 3, 16]


def _close(got, want, dtype):
    torch.testing.assert_close(got, want, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("m", ROWS)
def test_plain_normed_residual_and_silu_mul(dtype, cfg, m, device):
    x = randn(m, 40, dtype=dtype, device=device)  # K = 40, N = 27 / 38: neither fills a tile
    w = randn(27, 40, dtype=dtype, device=device, seed=1) * 0.3
    nw = randn(40, dtype=dtype, device=device, seed=2)
    _close(gemv_rows(x, w, config=cfg), gemv_rows_ref(x, w), dtype)
    _close(gemv_rows(x, w, norm_weight=nw, eps=1e-5, config=cfg), gemv_rows_ref(x, w, norm_weight=nw, eps=1e-5),
           dtype)
    res = randn(m, 27, dtype=dtype, device=device, seed=3)
    want = gemv_rows_ref(x, w, residual=res.clone())
    got = gemv_rows(x, w, residual=res, config=cfg)
    assert got.data_ptr() == res.data_ptr()
    _close(res, want, dtype)
    gate_up = randn(2 * 19, 40, dtype=dtype, device=device, seed=4) * 0.3  # I = 19
    got = gemv_rows(x, gate_up, norm_weight=nw, silu_mul=True, config=cfg)
    assert got.shape == (m, 19)
    _close(got, gemv_rows_ref(x, gate_up, norm_weight=nw, silu_mul=True), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_row_gets_what_it_gets_alone(dtype, device):
    """Each token's outputs depend on its own row only: the same bits alone and among 15 others,
    and within the single-token GEMV's tolerance."""
    x = randn(16, 40, dtype=dtype, device=device)
    w = randn(27, 40, dtype=dtype, device=device, seed=1)
    nw = randn(40, dtype=dtype, device=device, seed=2)
    many = gemv_rows(x, w, norm_weight=nw)
    for i in (0, 7, 15):
        assert torch.equal(gemv_rows(x[i:i + 1].contiguous(), w, norm_weight=nw), many[i:i + 1])
        _close(many[i:i + 1], gemv(x[i:i + 1].contiguous(), w, norm_weight=nw), dtype)


def _qkv_args(dtype, device, qk_norm, m):
    """gemv_rows_qkv_rotary's positional arguments: 4 q heads, 2 kv heads, head_dim 32, K = 48."""
    h, kv, d, k = 4, 2, 32, 48
    x = randn(m, k, dtype=dtype, device=device)
    w = randn((h + 2 * kv) * d, k, dtype=dtype, device=device, seed=1) * 0.3
    nw = randn(k, dtype=dtype, device=device, seed=2)
    ang = torch.outer(torch.arange(40.0), torch.rand(d // 2, generator=torch.Generator().manual_seed(4)))
    cos = torch.cat([ang, ang], -1).cos().to(dtype).to(device)
    sin = torch.cat([ang, ang], -1).sin().to(dtype).to(device)
    qn = randn(d, dtype=dtype, device=device, seed=5) if qk_norm else None
    kn = randn(d, dtype=dtype, device=device, seed=6) if qk_norm else None
    positions = torch.tensor([11 + 2 * i for i in range(m)], device=device)  # every token at its own position
    return (x, w, nw, 1e-6, cos, sin, positions, h, kv, qn, kn, 1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("m", [2, 5])
def test_qkv_with_rotary_writes_the_kv_cache(dtype, qk_norm, m, device):
    """q and k rotated at each token's position (and normed per head), v plain; with kv_cache each
    token's key and value land at its slot, a negative slot writes nothing, nothing else changes."""
    args = _qkv_args(dtype, device, qk_norm, m)
    x, w, nw, h, kv, d = args[0], args[1], args[2], args[7], args[8], args[4].shape[1]
    got = gemv_rows_qkv_rotary(*args)
    _close(got, gemv_rows_qkv_rotary_ref(*args), dtype)
    _close(got[:, (h + kv) * d:], gemv_ref(x, w, norm_weight=nw)[:, (h + kv) * d:], dtype)
    caches = [randn(12, kv, d, dtype=dtype, device=device, seed=s) for s in (7, 8)]
    want = [c.clone() for c in caches]
    slots = torch.tensor([9, -1, 2, 4, 0][:m], device=device)
    cfg = RowsConfig(d // 2, 16) if qk_norm else RowsConfig(16, 16)
    got = gemv_rows_qkv_rotary(*args, config=cfg, kv_cache=(caches[0], caches[1], slots))
    _close(got, gemv_qkv_rotary_ref(*args, kv_cache=(want[0], want[1], slots)), dtype)
    _close(caches[0], want[0], dtype)
    _close(caches[1], want[1], dtype)
    written = slots[slots >= 0].tolist()
    others = torch.tensor([s not in written for s in range(12)], device=device)
    assert torch.equal(caches[0][others], want[0][others]) and torch.equal(caches[1][others], want[1][others])
    for i, s in enumerate(slots.tolist()):
        if s >= 0:  # the written key and value are the returned ones, bit for bit
            assert torch.equal(caches[0][s].reshape(-1), got[i, h * d:(h + kv) * d])
            assert torch.equal(caches[1][s].reshape(-1), got[i, (h + kv) * d:])


def test_bad_input_is_refused(device):
    x = randn(17, 16, dtype=torch.float32, device=device)
    w = randn(8, 16, dtype=torch.float32, device=device)
    with pytest.raises(ValueError, match=r"1 to 16 rows"):
        gemv_rows(x, w)
    with pytest.raises(ValueError, match="silu_mul takes gate"):
        gemv_rows(x[:2], w[:7], silu_mul=True)
    with pytest.raises(ValueError, match="residual must be"):
        gemv_rows(x[:2], w, residual=torch.zeros(1, 8, device=device))
    with pytest.raises(ValueError, match="powers of two of at least 16"):
        gemv_rows(x[:2], w, config=RowsConfig(8, 16))
    cos = torch.zeros(4, 16, device=device)
    with pytest.raises(ValueError, match="multiple of 32"):
        gemv_rows_qkv_rotary(x[:2], randn(4 * 16, 16, dtype=torch.float32, device=device),
                             torch.ones(16, device=device), 1e-6, cos, cos, torch.tensor([0, 1], device=device), 2, 1)
    cos = torch.zeros(4, 32, device=device)
    with pytest.raises(ValueError, match=r"a position per row \[2\]"):
        gemv_rows_qkv_rotary(x[:2], randn(4 * 32, 16, dtype=torch.float32, device=device),
                             torch.ones(16, device=device), 1e-6, cos, cos, torch.tensor([0], device=device), 2, 1)
