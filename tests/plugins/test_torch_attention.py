"""The `torch` attention's computation (``_attend``) against a float64 softmax attention: the CPU's
matmul route (batches of several sequences), its float32 route (a lone half-precision decode) and
scaled_dot_product_attention (everything else) give the same result."""
from __future__ import annotations

import pytest
import torch

from deepinfer_builtin.attention import torch_attn


def _reference(q, k, v, mask, scale):
    h = q.shape[2]
    g = h // k.shape[2]
    kk = k.double().repeat_interleave(g, dim=2)  # query head j reads kv head j // g
    vv = v.double().repeat_interleave(g, dim=2)
    scores = torch.einsum("bthd,bnhd->bhtn", q.double(), kk) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhtn,bnhd->bthd", scores.softmax(-1), vv)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("b, t, masked", [(1, 1, False), (1, 5, True), (3, 1, False), (3, 1, True), (4, 6, True),
                                          (2, 17, True)])
@pytest.mark.parametrize("heads, kv_heads", [(6, 2), (4, 4)])
def test_each_route_is_softmax_attention(dtype, tol, b, t, masked, heads, kv_heads):
    g = torch.Generator().manual_seed(b * 100 + t)
    n, d = 37, 16
    q = torch.randn(b, t, heads, d, generator=g).to(dtype)
    k = torch.randn(b, n, kv_heads, d, generator=g).to(dtype)
    v = torch.randn(b, n, kv_heads, d, generator=g).to(dtype)
    mask = None
    if masked:  # causal at each sequence's own length, as build_metadata makes them
        lens = torch.randint(t, n + 1, (b,), generator=g)
        q_pos = lens[:, None] - t + torch.arange(t)[None, :]
        kv = torch.arange(n)
        mask = ((kv[None, None, :] <= q_pos[:, :, None]) & (kv[None, None, :] < lens[:, None, None]))[:, None]
    out = torch_attn._attend(q, k, v, mask, 0.25)
    assert out.shape == (b, t, heads, d) and out.dtype == dtype
    ref = _reference(q, k, v, mask, 0.25)
    assert (out.double() - ref).abs().max().item() < tol
