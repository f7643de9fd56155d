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


@pytest.mark.parametrize("b, t, masked", [(1, 1, False), (1, 5, True), (3, 1, True), (2, 17, True)])
def test_values_narrower_than_keys_are_softmax_attention(b, t, masked):
    """A latent layer's values (the keys' first dims) through each route of ``_attend``."""
    g = torch.Generator().manual_seed(7)
    n, d, dv = 29, 24, 16
    q = torch.randn(b, t, 4, d, generator=g)
    k = torch.randn(b, n, 1, d, generator=g)
    mask = None
    if masked:
        q_pos = n - t + torch.arange(t)
        mask = (torch.arange(n)[None, None, :] <= q_pos[:, None]).expand(b, t, n)[:, None]
    out = torch_attn._attend(q, k, k[..., :dv], mask, 0.3)
    assert out.shape == (b, t, 4, dv)
    assert (out.double() - _reference(q, k, k[..., :dv], mask, 0.3)).abs().max().item() < 1e-5


def test_latent_layer_caches_keys_alone_and_reads_values_as_their_prefix():
    """Oracle: the same layer as an ordinary one whose value is the whole key, narrowed after; the
    latent cache is one [slots, 1, D] tensor and its bytes are what kv_cache_bytes_per_block says."""
    from deepinfer.core.eager_batch import build_step_batch
    from deepinfer.plugins import AttentionLayerSpec

    d, dv, bs, blocks = 24, 16, 4, 16
    latent = AttentionLayerSpec(0, 4, 1, d, scale=0.3, value_dim=dv)
    plain = AttentionLayerSpec(1, 4, 1, d, scale=0.3)
    backend = torch_attn.TorchAttention(None, None)
    lat_cache, plain_cache = backend.allocate_kv_cache([latent, plain], blocks, bs, torch.float32, torch.device("cpu"))
    assert lat_cache.shape == (blocks * bs, 1, d) and plain_cache.shape == (2, blocks * bs, 1, d)
    per_block = backend.kv_cache_bytes_per_block([latent], bs, torch.float32)
    assert per_block * blocks == lat_cache.nbytes and 2 * per_block * blocks == plain_cache.nbytes
    g = torch.Generator().manual_seed(3)
    tables = [[0, 1, 2], [5, 6, 7, 8]]
    # a prefill of two sequences (5 and 11 tokens), then an extend of 3 and a decode in one step
    for seqs in ([(list(range(5)), 0, tables[0]), (list(range(11)), 0, tables[1])],
                 [([1, 2, 3], 5, tables[0]), ([4], 11, tables[1])]):
        batch = build_step_batch(seqs, bs, torch.device("cpu"))
        meta = backend.build_metadata(batch)
        tokens = batch.input_ids.shape[0]
        q = torch.randn(tokens, 4, d, generator=g)
        k = torch.randn(tokens, 1, d, generator=g)
        out = backend.forward(latent, q, k, None, lat_cache, meta)
        want = backend.forward(plain, q, k, k, plain_cache, meta)[..., :dv]
        assert out.shape == (tokens, 4, dv)
        torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(lat_cache, plain_cache[0])
