"""Decode attention and the output projection in one launch, against the two torch references."""
from __future__ import annotations

import pytest
import torch

from deepinfer_kernels import attention_o_proj, attention_o_proj_ref, pdl_supported
from deepinfer_kernels._launch import _COUNTERS
from tests.kernels.paged import DTYPES, TOL, i32, randn, random_paged_kv


def _case(seq_len, heads, kv_heads, d, n, dtype, device, seed=0):
    k, v, tables = random_paged_kv([seq_len], 4, kv_heads, d, dtype, device, seed=seed)
    q = randn(1, heads, d, dtype=dtype, device=device, seed=seed + 1)
    w = randn(n, heads * d, dtype=dtype, device=device, seed=seed + 2) * (heads * d) ** -0.5
    res = randn(1, n, dtype=dtype, device=device, seed=seed + 3)
    return q, k, v, tables, i32([seq_len], device), w, res


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seq_len", [1, 5, 16, 17, 70])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (6, 2), (2, 2)])  # groups of 2, 3 (padded) and 1
def test_matches_attention_then_the_residual_gemv(dtype, seq_len, heads, kv_heads, device):
    q, k, v, tables, lens, w, res = _case(seq_len, heads, kv_heads, 16, 40, dtype, device)
    want = attention_o_proj_ref(q, k, v, tables, lens, 4, 0.25, w, res.clone())
    # 40 rows: the second row block of 32 is partial; tiles of 16 keys: several tiles and a ragged one
    got = attention_o_proj(q, k, v, tables, lens, 4, 0.25, w, res.clone(), rows=32, block_n=16, block_keys=16)
    torch.testing.assert_close(got, want, atol=TOL[dtype] * 4, rtol=TOL[dtype] * 4)
    assert all(int(c.abs().sum()) == 0 for c in _COUNTERS.values())  # ready for the next launch


@pytest.mark.parametrize("window", [1, 7, 21])
def test_sliding_window(window, device):
    q, k, v, tables, lens, w, res = _case(45, 4, 2, 16, 24, torch.float32, device, seed=3)
    want = attention_o_proj_ref(q, k, v, tables, lens, 4, 0.25, w, res.clone(), sliding_window=window)
    got = attention_o_proj(q, k, v, tables, lens, 4, 0.25, w, res.clone(), sliding_window=window, rows=16,
                           block_n=8, block_keys=16)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_the_residual_is_updated_in_place_and_bad_inputs_refused(device):
    q, k, v, tables, lens, w, res = _case(9, 4, 2, 16, 16, torch.float32, device)
    before = res.clone()
    out = attention_o_proj(q, k, v, tables, lens, 4, 0.25, w, res, rows=16, block_n=16, block_keys=16)
    assert out.data_ptr() == res.data_ptr() and not torch.equal(res, before)
    with pytest.raises(ValueError, match="power-of-two head_dim"):
        attention_o_proj(q, k, v, tables, lens, 4, 0.25, w, res, rows=24, block_n=16)
    with pytest.raises(ValueError, match=r"o_proj \[N, 64\]"):
        attention_o_proj(q, k, v, tables, lens, 4, 0.25, w[:, :32], res)
    with pytest.raises(ValueError, match="one sequence"):
        attention_o_proj(q, k, v, tables.repeat(2, 1), lens, 4, 0.25, w, res)
    with pytest.raises(ValueError, match="evict must be one of"):
        attention_o_proj(q, k, v, tables, lens, 4, 0.25, w, res, evict="keep")


@pytest.mark.gpu
@pytest.mark.parametrize("seq_len", [1, 640, 2000])
def test_llama_shape_in_bfloat16_with_programmatic_launch(seq_len, device):
    if not pdl_supported(torch.device(device)):
        pytest.skip("programmatic dependent launch needs compute capability 9.0+ and Triton 3.4+")
    q, k, v, tables, lens, w, res = _case(seq_len, 32, 8, 64, 2048, torch.bfloat16, device)
    want = attention_o_proj_ref(q, k, v, tables, lens, 4, 0.125, w, res.clone())
    plain = attention_o_proj(q, k, v, tables, lens, 4, 0.125, w, res.clone())
    early = attention_o_proj(q, k, v, tables, lens, 4, 0.125, w, res.clone(), pdl=True, evict="evict_last")
    torch.testing.assert_close(plain, want, atol=0.05, rtol=0.02)
    assert torch.equal(plain, early)
