"""Rotary embedding (rotate-half) on q and k against its torch reference."""
from __future__ import annotations

import pytest
import torch

from deepinfer_kernels import apply_rotary, apply_rotary_ref
from tests.kernels.paged import DTYPES, randn

TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def _tables(max_pos: int, dim: int, dtype, device):
    inv = 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim)
    freqs = torch.outer(torch.arange(max_pos).float(), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype).to(device), emb.sin().to(dtype).to(device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 2, 16), (6, 3, 24)])
def test_rotary_matches_reference_on_fused_qkv_views(heads, kv_heads, dim, dtype, device):
    t = 7
    qkv = randn(t, (heads + 2 * kv_heads) * dim, dtype=dtype, device=device)
    q, k, _ = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k = q.view(t, heads, dim), k.view(t, kv_heads, dim)
    cos, sin = _tables(64, dim, dtype, device)
    positions = torch.tensor([0, 3, 4, 10, 63, 7, 7], device=device)
    q_out, k_out = apply_rotary(q, k, cos, sin, positions)
    q_ref, k_ref = apply_rotary_ref(q, k, cos, sin, positions)
    torch.testing.assert_close(q_out, q_ref, atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(k_out, k_ref, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_with_qk_norm_matches_norm_then_rotate(dtype, device):
    t, heads, kv_heads, dim = 5, 4, 2, 16
    qkv = randn(t, (heads + 2 * kv_heads) * dim, dtype=dtype, device=device) * 3
    q, k, _ = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k = q.view(t, heads, dim), k.view(t, kv_heads, dim)
    q_w = randn(dim, dtype=dtype, device=device)
    k_w = randn(dim, dtype=dtype, device=device)
    cos, sin = _tables(32, dim, dtype, device)
    positions = torch.tensor([0, 1, 9, 31, 9], device=device)
    q_out, k_out = apply_rotary(q, k, cos, sin, positions, q_w, k_w, 1e-6)
    q_ref, k_ref = apply_rotary_ref(q, k, cos, sin, positions, q_w, k_w, 1e-6)
    torch.testing.assert_close(q_out, q_ref, atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(k_out, k_ref, atol=TOL[dtype], rtol=TOL[dtype])
    plain_q, _ = apply_rotary(q, k, cos, sin, positions)
    assert not torch.allclose(plain_q, q_out)  # the norm was applied


def test_rotary_rejects_one_norm_without_the_other(device):
    q = torch.zeros(2, 4, 16, device=device)
    cos, sin = _tables(8, 16, torch.float32, device)
    with pytest.raises(ValueError, match="both be given"):
        apply_rotary(q, q[:, :2], cos, sin, torch.zeros(2, dtype=torch.long, device=device), torch.ones(16, device=device))
