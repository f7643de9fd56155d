"""MLA decode attention: the kernel against its torch reference, the reference against plain
attention over heads expanded from the latent (the oracle), and the latent cache write."""
from __future__ import annotations

import pytest
import torch

from deepinfer_kernels import (
    mla_decode_attention,
    mla_decode_attention_ref,
    write_mla_cache,
    write_mla_cache_ref,
)
from tests.kernels.paged import DTYPES, TOL, i32, randn, random_paged_kv

H, D, DV, BS = 4, 48, 32, 4  # heads, row width, latent (value) width, block size: tiny, for the interpreter
LENS = [1, 0, 7, 40, 33, 16]  # one token, a padding row, within a split, 3 splits of 16, one split exactly


def latent_cache(lens, dtype, device, block_size=BS, d=D, seed=0):
    """(kv_cache [slots, 1, d], block_tables): random rows, also in slots no table references."""
    cache, _, tables = random_paged_kv(lens, block_size, 1, d, dtype, device, seed=seed)
    return cache, tables


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split", [16, 32])
def test_mla_decode_matches_reference(split, dtype, device):
    kv, tables = latent_cache(LENS, dtype, device)
    q = randn(len(LENS), H, D, dtype=dtype, device=device)
    args = (q, kv, tables, i32(LENS, device), BS, DV, D ** -0.5)
    out = mla_decode_attention(*args, split_size=split)
    ref = mla_decode_attention_ref(*args)
    assert out.dtype == dtype and out.shape == (len(LENS), H, DV)
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype], rtol=TOL[dtype])
    assert torch.equal(out[1], torch.zeros_like(out[1]))  # the padding row: zeros, never stale partials


def test_reference_equals_attention_over_heads_expanded_from_the_latent(device):
    """The absorbed form is exact: with K_h = [c W_UK_h | k_pe] and V_h = c W_UV_h per head, plain
    softmax attention (scaled_dot_product_attention) of [q_nope_h | q_pe_h] gives
    (mla reference output of [W_UK_h q_nope_h | q_pe_h]) @ W_UV_h."""
    g = torch.Generator().manual_seed(5)
    heads, r, dr, dn, dv, n = 4, 32, 16, 24, 20, 37

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(device)

    c, k_pe, w_uk, w_uv = rnd(n, r), rnd(n, dr), rnd(heads, r, dn) * r ** -0.5, rnd(heads, r, dv)
    q_nope, q_pe = rnd(heads, dn), rnd(heads, dr)
    scale = (dn + dr) ** -0.5
    k = torch.cat([torch.einsum("nr,hrd->hnd", c, w_uk), k_pe.expand(heads, n, dr)], -1)
    v = torch.einsum("nr,hrd->hnd", c, w_uv)
    q = torch.cat([q_nope, q_pe], -1)
    oracle = torch.nn.functional.scaled_dot_product_attention(q[None, :, None], k[None], v[None], scale=scale)[0, :, 0]

    q_abs = torch.cat([torch.einsum("hrd,hd->hr", w_uk, q_nope), q_pe], -1)[None]  # [1, H, r + dr]
    cache = torch.cat([c, k_pe], -1)[:, None]                                     # [n, 1, r + dr]: one block
    latent = mla_decode_attention_ref(q_abs, cache, i32([[0]], device), i32([n], device), n, r, scale)
    got = torch.einsum("hr,hrd->hd", latent[0].double(), w_uv)
    torch.testing.assert_close(got, oracle, atol=1e-5, rtol=1e-5)  # the reference works in float32


def test_a_sequence_gives_the_same_bits_alone_and_in_any_batch(device):
    kv, tables = latent_cache(LENS, torch.float32, device)
    q = randn(len(LENS), H, D, dtype=torch.float32, device=device)

    def run(rows):
        return mla_decode_attention(q[rows], kv, tables[rows], i32([LENS[r] for r in rows], device), BS, DV, 0.2,
                                    split_size=16)

    alone = run([3])
    assert torch.equal(run([0, 1, 2, 3, 4, 5])[3], alone[0])
    assert torch.equal(run([4, 3])[1], alone[0])


def test_capped_grid_and_a_grid_sized_for_longer_sequences_give_the_same_bits(device):
    kv, tables = latent_cache(LENS, torch.float32, device)
    q = randn(len(LENS), H, D, dtype=torch.float32, device=device)
    args = (q, kv, tables, i32(LENS, device), BS, DV, 0.2)
    exact = mla_decode_attention(*args, split_size=16)
    assert torch.equal(mla_decode_attention(*args, max_seq_len=200, split_size=16), exact)  # 13 splits launched
    for cap in (6, 12):  # 6 (sequence, head tile) pairs: one program each, then two, taking splits in turn
        assert torch.equal(mla_decode_attention(*args, max_seq_len=200, split_size=16, max_programs=cap), exact)


def test_heads_of_more_than_one_tile(device):
    lens = [21, 5]
    kv, tables = latent_cache(lens, torch.float32, device)
    q = randn(2, 20, D, dtype=torch.float32, device=device)  # 16 + 4 heads: two tiles, the second partly empty
    args = (q, kv, tables, i32(lens, device), BS, DV, 0.2)
    torch.testing.assert_close(mla_decode_attention(*args, split_size=16), mla_decode_attention_ref(*args),
                               atol=TOL[torch.float32], rtol=TOL[torch.float32])


def test_value_dim_equal_to_the_row_means_no_rope_part(device):
    lens = [9, 30]
    kv, tables = latent_cache(lens, torch.float32, device, d=32)
    q = randn(2, H, 32, dtype=torch.float32, device=device)
    args = (q, kv, tables, i32(lens, device), BS, 32, 0.2)
    torch.testing.assert_close(mla_decode_attention(*args, split_size=16), mla_decode_attention_ref(*args),
                               atol=TOL[torch.float32], rtol=TOL[torch.float32])


@pytest.mark.parametrize("bad, match", [
    ({"kv_shape": (64, 2, D)}, r"expected \[num_slots, 1, 48\]"),
    ({"value_dim": 49}, "value_dim 49 must be in 1..48"),
    ({"split": 24}, "multiple of 16"),
    ({"block_h": 8}, "block_h 8"),
    ({"block_n": 32, "split": 16}, "block_n 32"),
])
def test_bad_shapes_are_refused_with_a_clear_error(bad, match, device):
    kv = torch.zeros(bad.get("kv_shape", (64, 1, D)), device=device)
    q = torch.zeros(1, H, D, device=device)
    with pytest.raises(ValueError, match=match):
        mla_decode_attention(q, kv, i32([[0]], device), i32([3], device), BS, bad.get("value_dim", DV), 1.0,
                             split_size=bad.get("split", 16), block_h=bad.get("block_h", 16),
                             block_n=bad.get("block_n"))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split_row", [True, False])
def test_latent_write_matches_reference_and_skips_negative_slots(split_row, dtype, device):
    t = 6
    fused = randn(t, 8 + D, dtype=dtype, device=device)  # latent and rope key as strided views of a projection
    slots = torch.tensor([9, -1, 0, 31, -1, 17], device=device)
    cache = randn(32, 1, D, dtype=dtype, device=device, seed=3)
    ref = cache.clone()
    args = (fused[:, 8:8 + DV], fused[:, 8 + DV:]) if split_row else (fused[:, None, 8:], None)
    write_mla_cache(*args, cache, slots)
    write_mla_cache_ref(*args, ref, slots)
    assert torch.equal(cache, ref)
    assert torch.equal(cache[[9, 0, 31, 17], 0], fused[[0, 2, 3, 5], 8:])
    untouched = torch.ones(32, dtype=torch.bool)
    untouched[[9, 0, 31, 17]] = False
    assert torch.equal(cache[untouched], randn(32, 1, D, dtype=dtype, device=device, seed=3)[untouched])


def test_latent_write_refuses_a_row_of_the_wrong_width(device):
    cache = torch.zeros(8, 1, D, device=device)
    with pytest.raises(ValueError, match="do not fit the cache"):
        write_mla_cache(torch.zeros(2, DV, device=device), torch.zeros(2, 8, device=device), cache,
                        torch.tensor([0, 1], device=device))


# DeepSeek-V3's shapes, compiled: H 16 (V2-Lite) and 128, rows of 512 + 64, bf16
@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("block_h", [16, 64])
def test_mla_decode_at_deepseek_v3_shapes(heads, block_size, block_h, device):
    if device != "cuda":
        pytest.skip("needs a GPU")
    lens = [8192, 1, 0, 300, 4097, 2048]
    dtype = torch.bfloat16
    kv, tables = latent_cache(lens, dtype, device, block_size=block_size, d=576)
    q = randn(len(lens), heads, 576, dtype=dtype, device=device)
    args = (q, kv, tables, i32(lens, device), block_size, 512, 192 ** -0.5)
    out = mla_decode_attention(*args, block_h=block_h)
    ref = mla_decode_attention_ref(*args)
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype], rtol=TOL[dtype])
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    alone = mla_decode_attention(q[3:4], kv, tables[3:4], i32(lens[3:4], device), block_size, 512, 192 ** -0.5,
                                 block_h=block_h)
    assert torch.equal(alone[0], out[3])
