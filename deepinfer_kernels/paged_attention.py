"""Paged decode attention: one query token per sequence, keys and values read from the paged cache.

Split-KV in two passes. Pass 1 computes each (sequence, kv head, split) on its own; a split is a
FIXED run of ``split_size`` key positions aligned to absolute positions (0..S-1, S..2S-1, ...), so
how a sequence is split depends on its own length only. The grid has up to one program per split;
past ``max_programs`` in all, a program takes several splits in turn (each computed alone, as
before), so a grid sized for the longest possible sequence (CUDA graphs) costs no idle programs
at large batch sizes. Each program handles every query head of
its kv head (GQA: the group shares one read of K and V) and writes a partial output and its
log-sum-exp. Pass 2 merges a sequence's splits in chunks of ``MERGE_CHUNK``, in order. No sum ever runs across a
sequence boundary or over a batch-sized extent, so a sequence's output is bit-identical whatever
else is in the batch (batch invariance).

Sliding window W: the query at position p attends keys p-W+1 .. p; splits wholly before the
window are not computed.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_kernels._launch import counters, kernel, next_pow2

LOG2E = 1.4426950408889634
DEFAULT_SPLIT = 256  # key positions per split; a multiple of every BLOCK_N used below
#: pass 1 launches at most about this many programs; beyond it a program takes several splits in turn
#: (a CUDA graph sizes its grid for the longest sequence it may see, which would otherwise launch
#: mostly empty programs at large batch sizes)
DEFAULT_MAX_PROGRAMS = 4096
#: splits a merge reads at once (one round trip to memory for up to this many, not one a split)
MERGE_CHUNK = 8


@kernel(do_not_specialize=["window", "max_splits", "table_cols", "stride_qb", "stride_bt", "stride_pb", "stride_lb",
                           "stride_ob"])
def _decode_split_kernel(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
                         part_out_ptr, part_lse_ptr, out_ptr, count_ptr, scale_log2, window, max_splits, table_cols,
                         stride_qb, stride_qh, stride_cs, stride_ch, stride_bt,
                         stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
                         MERGE: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                         BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                         CHUNK: tl.constexpr, EARLY_TABLE: tl.constexpr, WINDOWED: tl.constexpr, IEEE: tl.constexpr,
                         PDL: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    # The lengths and block tables are the step's inputs: under PDL (launched while the previous
    # kernel runs) they are read before the wait, so that after it only q and the keys and values
    # are (the newest key is the previous kernel's). In a staged replay they are the staging
    # kernel's output, which is finished by then: at least one kernel that waits before it lets the
    # next one launch (the embedding, the qkv GEMV) runs between the two.
    seq_len = tl.load(seq_lens_ptr + b)
    if EARLY_TABLE:
        # Without a window and with one tile a split, the program's first split (its only tile)
        # starts at a position known before the length is: its block-table entries are asked for
        # together with the length, not one round trip after it (entries past the sequence are
        # read but never used: the keys' mask needs the length). Splits of several tiles keep the
        # tile loop free of the branch below.
        pos0 = tl.program_id(2) * SPLIT + tl.arange(0, BLOCK_N)
        blk0 = tl.load(block_tables_ptr + b * stride_bt + pos0 // BLOCK_SIZE, mask=pos0 // BLOCK_SIZE < table_cols,
                       other=0)
    if PDL:  # launched early (programmatic dependent launch): wait for the previous kernel
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + g
    q_mask = (g[:, None] < GROUP) & (d[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=q_mask, other=0.0)
    lo = 0
    if WINDOWED:
        lo = tl.maximum(seq_len - window, 0)
    # never past the partials' buffer, even if the caller's max_seq_len was too small
    num_splits = tl.minimum(tl.where(seq_len > 0, (seq_len - 1) // SPLIT - lo // SPLIT + 1, 0), max_splits)
    dot_ty = k_cache_ptr.dtype.element_ty  # dot operands stay in the cache's dtype, products sum in fp32
    q = q.to(dot_ty)

    # This program takes splits j, j + programs, j + 2 * programs, ... of its sequence. A split is
    # computed the same way whichever program takes it, so the grid's size never changes a number.
    for j in range(tl.program_id(2), num_splits, tl.num_programs(2)):
        start = (lo // SPLIT + j) * SPLIT
        end = tl.minimum(start + SPLIT, seq_len)
        first_tile = tl.maximum(start, (lo // BLOCK_N) * BLOCK_N)
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for n0 in range(first_tile, end, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            valid = (pos >= lo) & (pos < end)
            if EARLY_TABLE:
                if j == tl.program_id(2):  # (a later split of a capped grid reads its own)
                    blk = blk0
                else:
                    blk = tl.load(block_tables_ptr + b * stride_bt + pos // BLOCK_SIZE, mask=valid, other=0)
            else:
                blk = tl.load(block_tables_ptr + b * stride_bt + pos // BLOCK_SIZE, mask=valid, other=0)
            slot = blk.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
            kv_off = slot[:, None] * stride_cs + kvh * stride_ch + d[None, :]
            kv_mask = valid[:, None] & (d[None, :] < HEAD_DIM)
            k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0)
            v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0)
            if IEEE:  # float32 caches: full-precision products, not TF32
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = tl.where(valid[None, :], s * scale_log2, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if IEEE:
                pv = tl.dot(p, v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(dot_ty), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new

        has_keys = l_i > 0.0
        out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        tl.store(part_out_ptr + b * stride_pb + heads[:, None] * stride_ph + j * stride_ps + d[None, :],
                 out, mask=q_mask)
        tl.store(part_lse_ptr + b * stride_lb + heads * stride_lh + j, lse, mask=g < GROUP)

    # the last program of this sequence and kv head merges the splits, exactly as pass 2 does. Only
    # programs that computed a split take part (a graph's grid is sized for its longest sequence: at
    # batch 1 most of it has nothing to do, and those programs end here, with no atomic); with no
    # split at all, program 0 writes the empty result.
    active = tl.maximum(tl.minimum(num_splits, tl.num_programs(2)), 1)
    if MERGE and tl.program_id(2) < active:
        tl.debug_barrier()  # every warp's partials are stored before the release below
        at = b * tl.num_programs(1) + kvh
        if tl.atomic_add(count_ptr + at, 1, sem="acq_rel") == active - 1:
            # the same code as _decode_reduce_kernel's, so the same bits (see there)
            c = tl.arange(0, CHUNK)
            g_mask = g[:, None] < GROUP
            gc_mask = g_mask & (c[None, :] < num_splits)
            lse_at = part_lse_ptr + b * stride_lb + heads[:, None] * stride_lh + c[None, :]
            o_at = (part_out_ptr + b * stride_pb + heads[:, None, None] * stride_ph + c[None, :, None] * stride_ps
                    + d[None, None, :])
            o_mask = gc_mask[:, :, None] & (d[None, None, :] < HEAD_DIM)
            lse_c = tl.load(lse_at, mask=gc_mask, other=float("-inf"), cache_modifier=".cg")
            o_c = tl.load(o_at, mask=o_mask, other=0.0, cache_modifier=".cg")
            mx = tl.max(lse_c, 1)
            for c0 in range(CHUNK, num_splits, CHUNK):
                more = g_mask & (c[None, :] < num_splits - c0)
                mx = tl.maximum(mx, tl.max(tl.load(lse_at + c0, mask=more, other=float("-inf"), cache_modifier=".cg"), 1))
            mx = tl.where(mx == float("-inf"), 0.0, mx)
            w = tl.exp2(lse_c - mx[:, None])
            merged = tl.sum(w[:, :, None] * o_c, 1)
            total = tl.sum(w, 1)
            for c0 in range(CHUNK, num_splits, CHUNK):  # chunk after chunk, in order
                more = g_mask & (c[None, :] < num_splits - c0)
                w = tl.exp2(tl.load(lse_at + c0, mask=more, other=float("-inf"), cache_modifier=".cg") - mx[:, None])
                o_c = tl.load(o_at + c0 * stride_ps, mask=more[:, :, None] & (d[None, None, :] < HEAD_DIM), other=0.0,
                              cache_modifier=".cg")
                merged += tl.sum(w[:, :, None] * o_c, 1)
                total += tl.sum(w, 1)
            merged = merged / tl.where(total > 0.0, total, 1.0)[:, None]
            tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
                     merged.to(out_ptr.dtype.element_ty), mask=q_mask)
            tl.store(count_ptr + at, 0)  # zero again for the next launch


@kernel(do_not_specialize=["window", "max_splits", "stride_pb", "stride_lb", "stride_ob"])
def _decode_reduce_kernel(part_out_ptr, part_lse_ptr, seq_lens_ptr, out_ptr, window, max_splits,
                          stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
                          GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                          SPLIT: tl.constexpr, CHUNK: tl.constexpr, WINDOWED: tl.constexpr, PDL: tl.constexpr):
    """Merges a sequence's splits for one kv head's query heads: CHUNK splits' partials read at
    once (one round trip to memory, not one a split), weighted sums over a chunk, chunk after chunk
    in order. The sums' order depends on CHUNK and the tile shapes only, never on the batch; pass
    1's merge (MERGE) runs this same code on the same shapes and warps, so it gives the same bits."""
    if PDL:  # launched early (programmatic dependent launch): wait for the previous kernel first
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + b)
    lo = 0
    if WINDOWED:
        lo = tl.maximum(seq_len - window, 0)
    num_splits = tl.minimum(tl.where(seq_len > 0, (seq_len - 1) // SPLIT - lo // SPLIT + 1, 0), max_splits)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + g
    q_mask = (g[:, None] < GROUP) & (d[None, :] < HEAD_DIM)
    c = tl.arange(0, CHUNK)
    g_mask = g[:, None] < GROUP
    gc_mask = g_mask & (c[None, :] < num_splits)
    lse_at = part_lse_ptr + b * stride_lb + heads[:, None] * stride_lh + c[None, :]
    o_at = (part_out_ptr + b * stride_pb + heads[:, None, None] * stride_ph + c[None, :, None] * stride_ps
            + d[None, None, :])
    o_mask = gc_mask[:, :, None] & (d[None, None, :] < HEAD_DIM)
    lse_c = tl.load(lse_at, mask=gc_mask, other=float("-inf"), cache_modifier=".cg")
    o_c = tl.load(o_at, mask=o_mask, other=0.0, cache_modifier=".cg")
    mx = tl.max(lse_c, 1)
    for c0 in range(CHUNK, num_splits, CHUNK):
        more = g_mask & (c[None, :] < num_splits - c0)
        mx = tl.maximum(mx, tl.max(tl.load(lse_at + c0, mask=more, other=float("-inf"), cache_modifier=".cg"), 1))
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    w = tl.exp2(lse_c - mx[:, None])
    merged = tl.sum(w[:, :, None] * o_c, 1)
    total = tl.sum(w, 1)
    for c0 in range(CHUNK, num_splits, CHUNK):  # chunk after chunk, in order
        more = g_mask & (c[None, :] < num_splits - c0)
        w = tl.exp2(tl.load(lse_at + c0, mask=more, other=float("-inf"), cache_modifier=".cg") - mx[:, None])
        o_c = tl.load(o_at + c0 * stride_ps, mask=more[:, :, None] & (d[None, None, :] < HEAD_DIM), other=0.0,
                      cache_modifier=".cg")
        merged += tl.sum(w[:, :, None] * o_c, 1)
        total += tl.sum(w, 1)
    merged = merged / tl.where(total > 0.0, total, 1.0)[:, None]
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
             merged.to(out_ptr.dtype.element_ty), mask=q_mask)


def num_decode_splits(max_seq_len: int, split_size: int, sliding_window: int | None) -> int:
    """Splits of the longest sequence (or of one window): the partials' buffer holds this many."""
    n = triton.cdiv(max(max_seq_len, 1), split_size)
    if sliding_window is not None:
        n = min(n, triton.cdiv(sliding_window - 1, split_size) + 1)
    return n


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int, scale: float,
                           sliding_window: int | None = None, max_seq_len: int | None = None,
                           split_size: int = DEFAULT_SPLIT, max_programs: int = DEFAULT_MAX_PROGRAMS,
                           block_n: int | None = None, num_warps: int = 4, num_stages: int | None = 2,
                           pdl: bool = False, merge_in_pass: bool = False) -> torch.Tensor:
    """Attention of q [B, H, D] (the token at position seq_len-1 of each sequence) over the cached
    keys/values [num_slots, kv_heads, D]; block_tables [B, max_blocks] int32, seq_lens [B] int32.
    Returns [B, H, D] in q's dtype. ``max_seq_len`` saves a device sync when the caller knows it.
    ``max_programs`` caps pass 1's grid (at least one program per sequence and kv head remains);
    it changes the speed only, never the result. ``block_n`` (keys per tile, dividing split_size;
    default the largest of 128, 64, 32, 16 that does, at most 64 for float32 or head_dim > 128),
    ``num_warps`` and ``num_stages`` (None: Triton's default) tune pass 1 (pass 2 takes the same, so
    that its merge is pass 1's); the defaults were the
    fastest on an H200. The tiles fix the order of the sums, so they may change the last bits
    (never batch invariance: they do not depend on the batch). ``pdl``: launch both passes with
    programmatic dependent launch (each waits for the previous kernel before reading anything but
    ``seq_lens`` and ``block_tables``, which pass 1 reads before its wait: they must not be the
    previous kernel's output; see deepinfer_kernels.pdl_supported). ``merge_in_pass``: the last pass-1 program of each
    sequence and kv head merges the splits (the same arithmetic as pass 2, so the same bits) and
    pass 2 is not launched: one launch fewer, worth it where launches are what costs (a single
    sequence); the merge then runs in as many programs as there are sequences and kv heads."""
    b, h, d = q.shape
    kvh = k_cache.shape[1]
    _check_shapes(q, k_cache, v_cache, block_tables, seq_lens, split_size)
    out = torch.empty_like(q)
    if b == 0:
        return out
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max())
    splits = num_decode_splits(max_seq_len, split_size, sliding_window)
    part_out = torch.empty(b, h, splits, d, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(b, h, splits, dtype=torch.float32, device=q.device)
    if q.stride(-1) != 1:
        q = q.contiguous()
    group = h // kvh
    if block_n is None:  # the largest tile that divides the split (128: fastest on an H200, run M),
        # but at most 64 keys of float32 or of heads over 128 wide (128 would overflow shared memory)
        widest = 64 if k_cache.dtype == torch.float32 or d > 128 else 128
        block_n = next(n for n in (128, 64, 32, 16) if n <= widest and split_size % n == 0)
    elif block_n < 16 or split_size % block_n or block_n & (block_n - 1):
        raise ValueError(f"block_n {block_n} must be a power of two of at least 16 dividing split_size {split_size}")
    tuning = {"num_warps": num_warps} if num_stages is None else {"num_warps": num_warps, "num_stages": num_stages}
    window = sliding_window or 0
    programs = max(1, min(splits, max_programs // (b * kvh)))
    count = counters(q.device, b * kvh, "decode_attention") if merge_in_pass else part_lse
    block_g, block_d = max(16, next_pow2(group)), max(16, next_pow2(d))
    _decode_split_kernel[(b, kvh, programs)](
        q, k_cache, v_cache, block_tables, seq_lens, part_out, part_lse, out, count, scale * LOG2E, window, splits,
        block_tables.shape[1],
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), block_tables.stride(0),
        part_out.stride(0), part_out.stride(1), part_out.stride(2), part_lse.stride(0), part_lse.stride(1),
        out.stride(0), out.stride(1), MERGE=merge_in_pass, GROUP=group, HEAD_DIM=d, BLOCK_SIZE=block_size,
        BLOCK_G=block_g, BLOCK_D=block_d, BLOCK_N=block_n, SPLIT=split_size, CHUNK=MERGE_CHUNK,
        EARLY_TABLE=sliding_window is None and block_n == split_size, WINDOWED=sliding_window is not None,
        IEEE=k_cache.dtype == torch.float32, PDL=pdl, **tuning)
    if merge_in_pass:
        return out
    _decode_reduce_kernel[(b, kvh)](  # pass 1's shapes and warps: its merge's bits (see the kernel)
        part_out, part_lse, seq_lens, out, window, splits,
        part_out.stride(0), part_out.stride(1), part_out.stride(2), part_lse.stride(0), part_lse.stride(1),
        out.stride(0), out.stride(1), GROUP=group, HEAD_DIM=d, BLOCK_G=block_g, BLOCK_D=block_d, SPLIT=split_size,
        CHUNK=MERGE_CHUNK, WINDOWED=sliding_window is not None, PDL=pdl, **tuning)
    return out


def _check_shapes(q, k_cache, v_cache, block_tables, seq_lens, split_size) -> None:
    b, h, d = q.shape
    if k_cache.dim() != 3 or k_cache.shape[2] != d or v_cache.shape != k_cache.shape:
        raise ValueError(f"caches {tuple(k_cache.shape)} / {tuple(v_cache.shape)} do not match q "
                         f"{tuple(q.shape)}; expected [num_slots, kv_heads, {d}] each")
    if h % k_cache.shape[1]:
        raise ValueError(f"{h} query heads are not a multiple of {k_cache.shape[1]} kv heads")
    if k_cache.stride(-1) != 1 or k_cache.stride() != v_cache.stride():
        raise ValueError("the key and value caches must share strides, with the last dimension contiguous")
    if block_tables.dim() != 2 or block_tables.shape[0] != b or seq_lens.shape != (b,):
        raise ValueError(f"block_tables {tuple(block_tables.shape)} and seq_lens {tuple(seq_lens.shape)} "
                         f"must be [{b}, max_blocks] and [{b}] for {b} sequences")
    if block_tables.stride(-1) != 1:
        raise ValueError("block_tables must be contiguous in its last dimension")
    if split_size % 16:
        raise ValueError(f"split_size {split_size} must be a multiple of 16")


def paged_decode_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, block_size, scale,
                               sliding_window=None, max_seq_len=None, split_size=DEFAULT_SPLIT) -> torch.Tensor:
    """Torch reference of :func:`paged_decode_attention`: one sequence at a time, in float32."""
    out = torch.empty_like(q)
    group = q.shape[1] // k_cache.shape[1]
    for i, n in enumerate(seq_lens.tolist()):
        pos = torch.arange(n, device=q.device)
        if sliding_window is not None:
            pos = pos[pos > n - 1 - sliding_window]
        slots = block_tables[i].long()[pos // block_size] * block_size + pos % block_size
        k = k_cache[slots].float().repeat_interleave(group, 1)   # [n, H, D]
        v = v_cache[slots].float().repeat_interleave(group, 1)
        s = torch.einsum("hd,nhd->hn", q[i].float(), k) * scale
        out[i] = torch.einsum("hn,nhd->hd", s.softmax(-1), v).to(q.dtype)
    return out



