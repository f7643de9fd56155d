"""Paged decode attention against its torch reference, and batch invariance of the split-KV kernel."""
from __future__ import annotations

import pytest
import torch

from deepinfer_kernels import paged_decode_attention, paged_decode_attention_ref
from tests.kernels.paged import DTYPES, TOL, i32, randn, random_paged_kv

# heads, kv_heads, head_dim, block_size, sliding_window, split_size
CASES = {
    "mha": (2, 2, 16, 4, None, 16),
    "gqa": (8, 2, 16, 4, None, 16),
    "gqa-window-not-multiple-of-block": (4, 1, 16, 4, 7, 16),
    "window-wider-than-one-split": (4, 2, 16, 8, 21, 16),
    "head-dim-24-block-16": (6, 3, 24, 16, 13, 32),
    "head-dim-64-group-4-window-of-many-splits": (8, 2, 64, 4, 140, 16),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_decode_matches_reference(case, dtype, device):
    heads, kv_heads, dim, bs, window, split = case
    lens = [1, 6, 37, 70, 150]  # one token only, within one split, several splits, more than a merge chunk
    k_cache, v_cache, tables = random_paged_kv(lens, bs, kv_heads, dim, dtype, device)
    q = randn(len(lens), heads, dim, dtype=dtype, device=device)
    args = (q, k_cache, v_cache, tables, i32(lens, device), bs, dim ** -0.5, window)
    out = paged_decode_attention(*args, split_size=split)
    ref = paged_decode_attention_ref(*args)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [None, 9])
def test_decode_of_a_sequence_is_bit_identical_alone_and_in_any_batch(window, dtype, device):
    lens = [45, 3, 130, 17]  # the batch's longest sequence launches more splits than ours needs
    k_cache, v_cache, tables = random_paged_kv(lens, 4, 2, 16, dtype, device)
    q = randn(len(lens), 4, 16, dtype=dtype, device=device)

    def run(rows):
        return paged_decode_attention(q[rows], k_cache, v_cache, tables[rows], i32([lens[r] for r in rows], device),
                                      4, 0.25, window, split_size=16)

    alone = run([0])
    assert torch.equal(run([0, 1, 2, 3])[0], alone[0])
    assert torch.equal(run([2, 3, 0])[2], alone[0])
    assert torch.equal(run([1, 0])[1], alone[0])


@pytest.mark.parametrize("window", [None, 21])
def test_capped_grid_gives_the_same_bits_as_one_program_per_split(window, device):
    # a graph's grid is sized for the longest sequence it may see; padding rows have length 0
    lens = [70, 0, 5, 33]
    k_cache, v_cache, tables = random_paged_kv(lens, 4, 2, 16, torch.float32, device)
    q = randn(len(lens), 4, 16, dtype=torch.float32, device=device)
    args = (q, k_cache, v_cache, tables, i32(lens, device), 4, 0.25, window, 200, 16)
    # max_seq_len 200: 13 splits (3 with the window), one program each, most of them idle
    full = paged_decode_attention(*args)
    for cap in (8, 16, 24):  # 8 (sequence, kv head) pairs: 1, 2, then 3 programs per pair
        assert torch.equal(paged_decode_attention(*args, max_programs=cap), full)
    ref = paged_decode_attention_ref(*args[:8])
    torch.testing.assert_close(full[[0, 2, 3]], ref[[0, 2, 3]], atol=TOL[torch.float32], rtol=TOL[torch.float32])
    assert torch.equal(full[1], torch.zeros_like(full[1]))  # no keys: zeros, never stale partials


def test_decode_never_writes_past_the_splits_of_max_seq_len(device):
    # a caller's max_seq_len below a sequence's length: that sequence is cut to the launched
    # splits (its keys past them ignored), and nothing is written outside the buffers
    lens = [40, 10]
    k_cache, v_cache, tables = random_paged_kv(lens, 4, 1, 16, torch.float32, device)
    q = randn(2, 2, 16, dtype=torch.float32, device=device)
    out = paged_decode_attention(q, k_cache, v_cache, tables, i32(lens, device), 4, 0.25, None, 16, 16)
    ref = paged_decode_attention_ref(q, k_cache, v_cache, tables, i32([16, 10], device), 4, 0.25)
    torch.testing.assert_close(out, ref, atol=TOL[torch.float32], rtol=TOL[torch.float32])


def test_decode_with_no_sequences_returns_empty(device):
    k_cache, v_cache, tables = random_paged_kv([4], 4, 1, 16, torch.float32, device)
    q = torch.empty(0, 2, 16, device=device)
    out = paged_decode_attention(q, k_cache, v_cache, tables[:0], i32([], device), 4, 1.0, max_seq_len=0)
    assert out.shape == (0, 2, 16)


def test_decode_rejects_heads_not_a_multiple_of_kv_heads(device):
    k_cache, v_cache, tables = random_paged_kv([4], 4, 2, 16, torch.float32, device)
    q = torch.zeros(1, 3, 16, device=device)
    with pytest.raises(ValueError, match="not a multiple of 2 kv heads"):
        paged_decode_attention(q, k_cache, v_cache, tables, i32([4], device), 4, 1.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [None, 21, 140])
@pytest.mark.parametrize("cap", [4096, 8])
def test_merge_in_pass_one_gives_the_bits_of_pass_two(dtype, window, cap, device):
    """The last pass-1 program of a sequence and kv head merges its splits (merge_in_pass, which
    the triton plugin asks for in steps of one token): the same numbers as the separate merge pass,
    bit for bit, also when a program takes several splits (a capped grid), and its counters are
    left at zero. 150 keys in splits of 16 are more splits than a merge reads at once."""
    from deepinfer_kernels._launch import _COUNTERS
    from deepinfer_kernels.paged_attention import MERGE_CHUNK

    lens = [70, 1, 150, 0]
    assert -(-150 // 16) > MERGE_CHUNK
    k_cache, v_cache, tables = random_paged_kv(lens, 4, 2, 16, dtype, device)
    q = randn(len(lens), 8, 16, dtype=dtype, device=device)
    args = (q, k_cache, v_cache, tables, i32(lens, device), 4, 0.25, window, 160, 16, cap)
    two = paged_decode_attention(*args, merge_in_pass=False)
    one = paged_decode_attention(*args, merge_in_pass=True)
    assert torch.equal(one, two)  # row 3 has no keys: zeros both ways
    assert all(int(c.abs().sum()) == 0 for c in _COUNTERS.values())


@pytest.mark.gpu
def test_attention_under_pdl_sees_the_key_the_qkv_kernel_wrote(device):
    """Under PDL, decode attention starts while the qkv GEMV that writes the step's key and value
    into the cache still runs (its lengths and block tables are read before its wait): the newest
    key and value must still be the GEMV's. Several steps of one sequence, each against a plain
    launch over the cache afterwards."""
    from deepinfer_kernels import gemv_qkv_rotary, pdl_supported

    if not pdl_supported(torch.device(device)):
        pytest.skip("programmatic dependent launch needs compute capability 9.0+ and Triton 3.4+")
    h, kv, d, k, page = 8, 2, 64, 512, 16
    dt = torch.bfloat16
    w = randn((h + 2 * kv) * d, k, dtype=dt, device=device, seed=3) * 0.05
    nw = torch.ones(k, dtype=dt, device=device)
    ang = torch.outer(torch.arange(512.0), torch.rand(d // 2, generator=torch.Generator().manual_seed(4)))
    cos, sin = (f(torch.cat([ang, ang], -1)).to(dt).to(device) for f in (torch.cos, torch.sin))
    k_cache, v_cache, tables = random_paged_kv([400], page, kv, d, dt, device)
    for n in (130, 200, 256, 257, 300):
        x = randn(1, k, dtype=dt, device=device, seed=n)
        pos = torch.tensor([n - 1], device=device)
        slot = (tables[0, (n - 1) // page].long() * page + (n - 1) % page).reshape(1)
        qkv = gemv_qkv_rotary(x, w, nw, 1e-6, cos, sin, pos, h, kv, pdl=True, kv_cache=(k_cache, v_cache, slot))
        q = qkv[:, :h * d].view(1, h, d)
        args = (q, k_cache, v_cache, tables, i32([n], device), page, d ** -0.5)
        got = paged_decode_attention(*args, max_seq_len=512, split_size=128, pdl=True, merge_in_pass=True)
        torch.cuda.synchronize()
        assert torch.equal(got, paged_decode_attention(*args, max_seq_len=512, split_size=128, merge_in_pass=True)), n


@pytest.mark.gpu
@pytest.mark.parametrize("window", [None, 21])
def test_programmatic_launch_gives_the_same_bits(window, device):
    """Launched with PDL (single-token steps), and merging in pass 1, the kernel gives the numbers
    of a plain launch: short and long sequences, one or several splits per program."""
    from deepinfer_kernels import pdl_supported

    if not pdl_supported(torch.device(device)):
        pytest.skip("programmatic dependent launch needs compute capability 9.0+ and Triton 3.4+")
    for lens in ([1], [5], [16], [17], [70], [300]):
        k_cache, v_cache, tables = random_paged_kv(lens, 4, 2, 16, torch.bfloat16, device)
        q = randn(len(lens), 8, 16, dtype=torch.bfloat16, device=device)
        for cap in (4096, 2):
            args = (q, k_cache, v_cache, tables, i32(lens, device), 4, 0.25, window, 320, 16, cap)
            plain = paged_decode_attention(*args, merge_in_pass=True)
            early = paged_decode_attention(*args, pdl=True, merge_in_pass=True)
            assert torch.equal(plain, early), (lens, cap)
