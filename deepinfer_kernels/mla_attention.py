"""MLA decode attention (DeepSeek-V2/V3 with the up-projections absorbed) over a paged latent cache.

Each cached token is ONE row of D entries shared by every head: ``[latent (value_dim) | rope key
(D - value_dim)]`` (DeepSeek-V3: 512 + 64). The key of every head is the whole row, its value the
row's first ``value_dim`` entries; the query of head h is ``[q_nope absorbed into the latent |
q_pe]``. So this is multi-query attention whose value is a prefix of its key: a program takes a
tile of heads (``block_h``, as FlashMLA takes 64) and reads each cached row once for all of them,
using the same loaded tile as key and as value.

Split-KV in two passes, as paged_attention.py: pass 1 computes each (sequence, head tile, split)
alone, a split being a FIXED run of ``split_size`` positions aligned to absolute positions, and
writes a partial output and its log-sum-exp; past ``max_programs`` a program takes several splits
in turn. Pass 2 merges a sequence's splits in order, one head a program. No sum crosses a sequence
or a batch-sized extent, so a sequence's output never depends on the rest of the batch. A
sequence of length 0 (padding) gets zeros.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_kernels._launch import kernel, next_pow2

LOG2E = 1.4426950408889634
DEFAULT_SPLIT = 256  # key positions per split
DEFAULT_MAX_PROGRAMS = 4096
MERGE_CHUNK = 8  # splits the merge reads at once


@kernel(do_not_specialize=["max_splits", "stride_qb", "stride_bt", "stride_pb", "stride_lb"])
def _mla_split_kernel(q_ptr, kv_ptr, block_tables_ptr, seq_lens_ptr, part_out_ptr, part_lse_ptr,
                      scale_log2, max_splits, stride_qb, stride_qh, stride_cs, stride_bt,
                      stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
                      NUM_HEADS: tl.constexpr, LATENT: tl.constexpr, ROPE: tl.constexpr,
                      BLOCK_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_L: tl.constexpr,
                      BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, IEEE: tl.constexpr):
    b = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    seq_len = tl.load(seq_lens_ptr + b)
    dl = tl.arange(0, BLOCK_L)
    dr = tl.arange(0, BLOCK_R)
    h_ok = heads < NUM_HEADS
    q_row = q_ptr + b * stride_qb + heads[:, None] * stride_qh
    dot_ty = kv_ptr.dtype.element_ty  # dot operands in the cache's dtype, products summed in fp32
    q_lat = tl.load(q_row + dl[None, :], mask=h_ok[:, None] & (dl[None, :] < LATENT), other=0.0).to(dot_ty)
    q_pe = tl.load(q_row + LATENT + dr[None, :], mask=h_ok[:, None] & (dr[None, :] < ROPE), other=0.0).to(dot_ty)
    # never past the partials' buffer, even if the caller's max_seq_len was too small
    num_splits = tl.minimum(tl.cdiv(seq_len, SPLIT), max_splits)
    for j in range(tl.program_id(2), num_splits, tl.num_programs(2)):
        end = tl.minimum(j * SPLIT + SPLIT, seq_len)
        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_L], tl.float32)
        for n0 in range(j * SPLIT, end, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            valid = pos < end
            blk = tl.load(block_tables_ptr + b * stride_bt + pos // BLOCK_SIZE, mask=valid, other=0)
            row = kv_ptr + (blk.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE)[:, None] * stride_cs
            lat = tl.load(row + dl[None, :], mask=valid[:, None] & (dl[None, :] < LATENT), other=0.0)
            pe = tl.load(row + LATENT + dr[None, :], mask=valid[:, None] & (dr[None, :] < ROPE), other=0.0)
            if IEEE:  # float32 caches: full-precision products, not TF32
                s = tl.dot(q_lat, tl.trans(lat), input_precision="ieee")
                s = tl.dot(q_pe, tl.trans(pe), s, input_precision="ieee")
            else:
                s = tl.dot(q_pe, tl.trans(pe), tl.dot(q_lat, tl.trans(lat)))
            s = tl.where(valid[None, :], s * scale_log2, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if IEEE:
                pv = tl.dot(p, lat, input_precision="ieee")
            else:
                pv = tl.dot(p.to(dot_ty), lat)  # the latent is the value: the tile already loaded
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        has_keys = l_i > 0.0
        out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        tl.store(part_out_ptr + b * stride_pb + heads[:, None] * stride_ph + j * stride_ps + dl[None, :], out,
                 mask=h_ok[:, None] & (dl[None, :] < LATENT))
        tl.store(part_lse_ptr + b * stride_lb + heads * stride_lh + j, lse, mask=h_ok)


@kernel(do_not_specialize=["max_splits", "stride_pb", "stride_lb", "stride_ob"])
def _mla_merge_kernel(part_out_ptr, part_lse_ptr, seq_lens_ptr, out_ptr, max_splits,
                      stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
                      LATENT: tl.constexpr, BLOCK_L: tl.constexpr, SPLIT: tl.constexpr, CHUNK: tl.constexpr):
    """One (sequence, head): the splits' partials weighted by exp(lse - max), CHUNK splits at a
    time, in order (the sums' order depends on CHUNK only, never on the batch)."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    num_splits = tl.minimum(tl.cdiv(tl.load(seq_lens_ptr + b), SPLIT), max_splits)
    c = tl.arange(0, CHUNK)
    dl = tl.arange(0, BLOCK_L)
    lse_at = part_lse_ptr + b * stride_lb + h * stride_lh + c
    o_at = part_out_ptr + b * stride_pb + h * stride_ph + c[:, None] * stride_ps + dl[None, :]
    mx = tl.max(tl.load(lse_at, mask=c < num_splits, other=float("-inf")), 0)
    for c0 in range(CHUNK, num_splits, CHUNK):
        mx = tl.maximum(mx, tl.max(tl.load(lse_at + c0, mask=c < num_splits - c0, other=float("-inf")), 0))
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    merged = tl.zeros([BLOCK_L], tl.float32)
    total = tl.zeros([CHUNK], tl.float32)
    for c0 in range(0, num_splits, CHUNK):  # chunk after chunk, in order
        more = c < num_splits - c0
        w = tl.exp2(tl.load(lse_at + c0, mask=more, other=float("-inf")) - mx)
        o_c = tl.load(o_at + c0 * stride_ps, mask=more[:, None] & (dl[None, :] < LATENT), other=0.0)
        merged += tl.sum(w[:, None] * o_c, 0)
        total += w
    denom = tl.sum(total, 0)
    merged = merged / tl.where(denom > 0.0, denom, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + dl, merged.to(out_ptr.dtype.element_ty), mask=dl < LATENT)


def mla_decode_attention(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                         seq_lens: torch.Tensor, block_size: int, value_dim: int, scale: float,
                         max_seq_len: int | None = None, split_size: int = DEFAULT_SPLIT,
                         max_programs: int = DEFAULT_MAX_PROGRAMS, block_h: int | None = None,
                         block_n: int | None = None, num_warps: int = 4, num_stages: int | None = 2) -> torch.Tensor:
    """Absorbed-MLA decode of q [B, H, D] (the token at position seq_len-1 of each sequence) over the
    latent cache [num_slots, 1, D] (row = [latent (value_dim) | rope key]); block_tables
    [B, max_blocks] int32, seq_lens [B] int32 (0: a padding row, output zeros). Returns
    [B, H, value_dim] in q's dtype: the attention output in latent space, before W_UV.

    ``max_seq_len`` saves a device sync and sizes the grid (a CUDA graph passes the longest it may
    see; a sequence longer than it is cut to its splits). ``max_programs`` caps pass 1's grid and
    changes the speed only, never a bit. ``block_h`` heads share one read of each cached row
    (16, 32 or 64; default 16 for up to 16 heads, else 32); ``block_n`` (keys per tile, a power of
    two of at least 16 dividing split_size; default 32), ``num_warps`` and ``num_stages`` tune pass
    1. The defaults were the fastest of a sweep on an H100 at 512 + 64 wide rows (16 and 128 heads,
    batch 1 and 64, 512 and 4096 keys); the tiles fix the order of the sums, so they may change
    the last bits, never batch invariance.
    """
    if block_h is None:
        block_h = 16 if q.dim() == 3 and q.shape[1] <= 16 else 32
    b, h, d = q.shape
    _check_shapes(q, kv_cache, block_tables, seq_lens, value_dim, split_size, block_h)
    out = torch.empty(b, h, value_dim, dtype=q.dtype, device=q.device)
    if b == 0:
        return out
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max())
    splits = triton.cdiv(max(max_seq_len, 1), split_size)
    if block_n is None:
        block_n = min(split_size & -split_size, 32)
    if block_n < 16 or split_size % block_n or block_n & (block_n - 1):
        raise ValueError(f"block_n {block_n} must be a power of two of at least 16 dividing split_size {split_size}")
    part_out = torch.empty(b, h, splits, value_dim, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(b, h, splits, dtype=torch.float32, device=q.device)
    if q.stride(-1) != 1:
        q = q.contiguous()
    tuning = {"num_warps": num_warps} if num_stages is None else {"num_warps": num_warps, "num_stages": num_stages}
    head_tiles = triton.cdiv(h, block_h)
    programs = max(1, min(splits, max_programs // (b * head_tiles)))
    rope = d - value_dim
    block_l = next_pow2(value_dim)
    _mla_split_kernel[(b, head_tiles, programs)](
        q, kv_cache, block_tables, seq_lens, part_out, part_lse, scale * LOG2E, splits,
        q.stride(0), q.stride(1), kv_cache.stride(0), block_tables.stride(0),
        part_out.stride(0), part_out.stride(1), part_out.stride(2), part_lse.stride(0), part_lse.stride(1),
        NUM_HEADS=h, LATENT=value_dim, ROPE=rope, BLOCK_SIZE=block_size, BLOCK_H=block_h, BLOCK_L=block_l,
        BLOCK_R=max(16, next_pow2(rope)), BLOCK_N=block_n, SPLIT=split_size, IEEE=kv_cache.dtype == torch.float32,
        **tuning)
    _mla_merge_kernel[(b, h)](
        part_out, part_lse, seq_lens, out, splits,
        part_out.stride(0), part_out.stride(1), part_out.stride(2), part_lse.stride(0), part_lse.stride(1),
        out.stride(0), out.stride(1), LATENT=value_dim, BLOCK_L=block_l, SPLIT=split_size, CHUNK=MERGE_CHUNK,
        num_warps=4)
    return out


def _check_shapes(q, kv_cache, block_tables, seq_lens, value_dim, split_size, block_h) -> None:
    if q.dim() != 3:
        raise ValueError(f"q has shape {tuple(q.shape)}; expected [batch, heads, head_dim]")
    b, _, d = q.shape
    if kv_cache.dim() != 3 or kv_cache.shape[1:] != (1, d):
        raise ValueError(f"kv_cache {tuple(kv_cache.shape)} does not match q {tuple(q.shape)}; expected "
                         f"[num_slots, 1, {d}]: one latent row per token shared by all heads")
    if kv_cache.stride(-1) != 1:
        raise ValueError("kv_cache must be contiguous in its last dimension")
    if not 0 < value_dim <= d:
        raise ValueError(f"value_dim {value_dim} must be in 1..{d} (the latent prefix of each {d}-wide row)")
    if block_tables.dim() != 2 or block_tables.shape[0] != b or seq_lens.shape != (b,):
        raise ValueError(f"block_tables {tuple(block_tables.shape)} and seq_lens {tuple(seq_lens.shape)} "
                         f"must be [{b}, max_blocks] and [{b}] for {b} sequences")
    if block_tables.stride(-1) != 1:
        raise ValueError("block_tables must be contiguous in its last dimension")
    if split_size % 16:
        raise ValueError(f"split_size {split_size} must be a multiple of 16")
    if block_h not in (16, 32, 64):
        raise ValueError(f"block_h {block_h} must be 16, 32 or 64 (heads per program)")


def mla_decode_attention_ref(q, kv_cache, block_tables, seq_lens, block_size, value_dim, scale,
                             max_seq_len=None, split_size=DEFAULT_SPLIT) -> torch.Tensor:
    """Torch reference of :func:`mla_decode_attention`: one sequence at a time, in float32."""
    out = torch.zeros(q.shape[0], q.shape[1], value_dim, dtype=q.dtype, device=q.device)
    for i, n in enumerate(seq_lens.tolist()):
        if n == 0:
            continue
        pos = torch.arange(n, device=q.device)
        slots = block_tables[i].long()[pos // block_size] * block_size + pos % block_size
        rows = kv_cache[slots, 0].float()                          # [n, D]
        s = q[i].float() @ rows.T * scale                          # [H, n]
        out[i] = (s.softmax(-1) @ rows[:, :value_dim]).to(q.dtype)
    return out
