"""The single-token GEMV reading decode attention's unmerged splits (o_proj after
``paged_decode_attention_partials``): the projection of the merged attention output."""
from __future__ import annotations

import pytest
import torch

from deepinfer_kernels import GemvConfig, gemv, gemv_ref, paged_decode_attention, paged_decode_attention_partials
from deepinfer_kernels.paged_attention import MERGE_CHUNK
from tests.kernels.paged import DTYPES, TOL, i32, randn, random_paged_kv

H, KV, D, PAGE, SPLIT = 8, 2, 16, 4, 16
# lengths whose splits of 16 are none, one, a few, exactly a merge chunk and more than one (pass 1
# merges those); a window of 21 keys spans two or three splits
LENS = [0, 1, 17, 70, 128, 150]
# K split in two: tiles of whole heads, and tiles narrower than a head
CONFIGS = [None, GemvConfig(4, 32, 2), GemvConfig(4, 8, 2, prefetch=False)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [None, 21])
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_gemv_over_partials_is_the_projection_of_the_merged_attention(dtype, window, cfg, device):
    from deepinfer_kernels._launch import _COUNTERS

    assert -(-150 // SPLIT) > MERGE_CHUNK == 128 // SPLIT
    k_cache, v_cache, tables = random_paged_kv([max(LENS)], PAGE, KV, D, dtype, device)
    weight = randn(24, H * D, dtype=dtype, device=device, seed=3) * 0.2
    tol = TOL[dtype]
    for n in LENS:
        q = randn(1, H, D, dtype=dtype, device=device, seed=n)
        args = (q, k_cache, v_cache, tables, i32([n], device), PAGE, 0.25, window, 160, SPLIT)
        parts = paged_decode_attention_partials(*args)
        attn = paged_decode_attention(*args, merge_in_pass=True).view(1, H * D)
        torch.testing.assert_close(parts.merged_ref().float(), attn.float(), atol=tol, rtol=tol)
        res = randn(1, 24, dtype=dtype, device=device, seed=7)
        got = gemv(parts, weight, residual=res.clone(), config=cfg)
        want = gemv(attn, weight, residual=res.clone(), config=cfg)
        ref = gemv_ref(parts, weight, residual=res.clone())
        ns = 0 if n == 0 else (n - 1) // SPLIT - (max(n - window, 0) if window else 0) // SPLIT + 1
        if ns > MERGE_CHUNK:  # pass 1 merged: the GEMV reads its output, the same bits
            assert torch.equal(got, want), n
        else:
            torch.testing.assert_close(got.float(), want.float(), atol=4 * tol, rtol=4 * tol)
        torch.testing.assert_close(got.float(), ref.float(), atol=4 * tol, rtol=4 * tol)
        plain = gemv(parts, weight, config=cfg)  # no residual: the product alone
        torch.testing.assert_close(plain.float(), gemv_ref(parts, weight).float(), atol=4 * tol, rtol=4 * tol)
    assert all(int(c.abs().sum()) == 0 for c in _COUNTERS.values())  # pass 1's and split K's


def test_gemv_over_partials_refuses_what_it_cannot_fuse(device):
    k_cache, v_cache, tables = random_paged_kv([20], PAGE, KV, D, torch.float32, device)
    q = randn(1, H, D, dtype=torch.float32, device=device)
    parts = paged_decode_attention_partials(q, k_cache, v_cache, tables, i32([20], device), PAGE, 0.25)
    w = randn(2 * 24, H * D, dtype=torch.float32, device=device)
    with pytest.raises(ValueError, match="plain projection"):
        gemv(parts, w, norm_weight=torch.ones(H * D, device=device))
    with pytest.raises(ValueError, match="plain projection"):
        gemv(parts, w, silu_mul=True)
    with pytest.raises(ValueError, match=r"one sequence, q \[1, H, D\]"):
        paged_decode_attention_partials(q.expand(2, H, D), k_cache, v_cache, tables.expand(2, -1),
                                        i32([20, 20], device), PAGE, 0.25)
