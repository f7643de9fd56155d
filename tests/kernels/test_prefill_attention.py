"""Prefill/extend attention over the paged cache against its torch reference."""
from __future__ import annotations

import pytest
import torch

from deepinfer_kernels import paged_prefill_attention, paged_prefill_attention_ref
from tests.kernels.paged import DTYPES, TOL, i32, randn, random_paged_kv

# heads, kv_heads, head_dim, block_size, sliding_window
CASES = {
    "mha": (2, 2, 16, 4, None),
    "gqa": (8, 2, 16, 4, None),
    "gqa-window-not-multiple-of-block": (4, 1, 16, 4, 7),
    "head-dim-24-window-13": (6, 3, 24, 16, 13),
}
# (context_len, seq_len) per sequence: a whole prompt, an extend after a cached prefix, a
# one-token extend, a long extend crossing several query tiles
SEQS = [(0, 9), (20, 37), (40, 41), (5, 50)]


def _batch(seqs, device):
    ctx = [c for c, _ in seqs]
    lens = [n for _, n in seqs]
    starts = [0]
    for c, n in seqs:
        starts.append(starts[-1] + n - c)
    return i32(starts, device), i32(lens, device), i32(ctx, device), lens


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_prefill_matches_reference(case, dtype, device):
    heads, kv_heads, dim, bs, window = case
    qsl, seq_lens, ctx_lens, lens = _batch(SEQS, device)
    k_cache, v_cache, tables = random_paged_kv(lens, bs, kv_heads, dim, dtype, device)
    q = randn(int(qsl[-1]), heads, dim, dtype=dtype, device=device)
    args = (q, k_cache, v_cache, qsl, seq_lens, ctx_lens, tables, bs, dim ** -0.5, window)
    out = paged_prefill_attention(*args)
    ref = paged_prefill_attention_ref(*args)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)])
def test_prefill_of_a_sequence_is_bit_identical_alone_and_in_a_batch(dtype, device):
    qsl, seq_lens, ctx_lens, lens = _batch(SEQS, device)
    k_cache, v_cache, tables = random_paged_kv(lens, 4, 2, 16, dtype, device)
    q = randn(int(qsl[-1]), 4, 16, dtype=dtype, device=device)
    together = paged_prefill_attention(q, k_cache, v_cache, qsl, seq_lens, ctx_lens, tables, 4, 0.25, 11)
    rows = slice(int(qsl[1]), int(qsl[2]))
    alone = paged_prefill_attention(q[rows], k_cache, v_cache, i32([0, rows.stop - rows.start], device),
                                    seq_lens[1:2], ctx_lens[1:2], tables[1:2], 4, 0.25, 11)
    assert torch.equal(together[rows], alone)


def test_skip_single_leaves_one_token_runs_to_the_caller(device):
    qsl, seq_lens, ctx_lens, lens = _batch(SEQS, device)
    k_cache, v_cache, tables = random_paged_kv(lens, 4, 2, 16, torch.float32, device)
    q = randn(int(qsl[-1]), 4, 16, dtype=torch.float32, device=device)
    out = torch.full_like(q, 7.0)
    paged_prefill_attention(q, k_cache, v_cache, qsl, seq_lens, ctx_lens, tables, 4, 0.25, skip_single=True, out=out)
    single = int(qsl[2])  # the third sequence extends by one token
    assert torch.all(out[single] == 7.0)
    ref = paged_prefill_attention_ref(q, k_cache, v_cache, qsl, seq_lens, ctx_lens, tables, 4, 0.25)
    keep = torch.ones(q.shape[0], dtype=torch.bool)
    keep[single] = False
    torch.testing.assert_close(out[keep], ref[keep], atol=2e-5, rtol=2e-5)


def test_rows_other_than_the_new_tokens_follow_query_start_loc_as_in_the_reference(device):
    # a padded graph's runs: fewer rows than new tokens, none, more than the sequence's keys reach,
    # and a row of an empty sequence (it sees no key: zeros)
    seqs = [(0, 9, 3), (20, 37, 0), (40, 41, 1), (10, 10, 2), (0, 0, 1)]
    starts = [0]
    for _, _, rows in seqs:
        starts.append(starts[-1] + rows)
    qsl, lens = i32(starts, device), [n for _, n, _ in seqs]
    seq_lens, ctx_lens = i32(lens, device), i32([c for c, _, _ in seqs], device)
    k_cache, v_cache, tables = random_paged_kv([max(n, 1) for n in lens], 4, 2, 16, torch.float32, device)
    q = randn(starts[-1], 4, 16, dtype=torch.float32, device=device)
    args = (q, k_cache, v_cache, qsl, seq_lens, ctx_lens, tables, 4, 0.25)
    out, ref = paged_prefill_attention(*args), paged_prefill_attention_ref(*args)
    assert torch.all(ref[-1] == 0) and ref[:-1].abs().sum(-1).gt(0).all()
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
