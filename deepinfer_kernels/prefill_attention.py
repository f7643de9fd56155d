"""Prefill/extend attention over the paged cache: a variable-length batch of query runs, each
continuing a sequence whose first ``context_len`` tokens are already cached.

Queries are flattened [T, H, D]; sequence ``b`` owns rows ``query_start_loc[b] ..<
query_start_loc[b+1]``, at positions ``context_len[b] ..< seq_len[b]``. Keys and values are all read
from the paged cache (this step's were written there first), so a cached prefix and the new
tokens are one range of key positions. Causal, with an optional sliding window W (the query at
position p sees keys p-W+1 .. p); GQA maps query head h to kv head h // (H / kv_heads).

One program per (query tile, sequence, head) runs a flash-attention loop over the key tiles that
tile can see; its result depends on its own sequence only, never on the rest of the batch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_kernels._launch import kernel, next_pow2

LOG2E = 1.4426950408889634


@kernel(do_not_specialize=["window", "stride_bt"])
def _prefill_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, query_start_loc_ptr,
                    seq_lens_ptr, context_lens_ptr, scale_log2, window,
                    stride_qt, stride_qh, stride_ot, stride_oh, stride_cs, stride_ch, stride_bt,
                    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, WINDOWED: tl.constexpr,
                    SKIP_SINGLE: tl.constexpr, IEEE: tl.constexpr):
    tile = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    kvh = h // GROUP
    q_start = tl.load(query_start_loc_ptr + b)
    q_len = tl.load(query_start_loc_ptr + b + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + b)
    ctx_len = tl.load(context_lens_ptr + b)
    if SKIP_SINGLE:  # one-token runs are left to the decode kernel
        q_len = tl.where(q_len == 1, 0, q_len)

    i = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    q_valid = i < q_len
    q_pos = ctx_len + i
    q_mask = q_valid[:, None] & (d[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + (q_start + i)[:, None] * stride_qt + h * stride_qh + d[None, :], mask=q_mask, other=0.0)
    dot_ty = k_cache_ptr.dtype.element_ty  # dot operands stay in the cache's dtype, products sum in fp32
    q = q.to(dot_ty)

    # key range seen by this tile: causal end at its last query, window start at its first
    last_q = ctx_len + tl.minimum(tile * BLOCK_M + BLOCK_M, q_len) - 1
    hi = tl.where(tile * BLOCK_M < q_len, tl.minimum(last_q + 1, seq_len), 0)
    lo = 0
    if WINDOWED:
        lo = tl.maximum(ctx_len + tile * BLOCK_M - window + 1, 0)
        lo = (lo // BLOCK_N) * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        k_valid = pos < hi
        blk = tl.load(block_tables_ptr + b * stride_bt + pos // BLOCK_SIZE, mask=k_valid, other=0)
        slot = blk.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
        kv_off = slot[:, None] * stride_cs + kvh * stride_ch + d[None, :]
        kv_mask = k_valid[:, None] & (d[None, :] < HEAD_DIM)
        k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0)
        if IEEE:  # float32 caches: full-precision products, not TF32
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        see = k_valid[None, :] & (pos[None, :] <= q_pos[:, None])
        if WINDOWED:
            see = see & (q_pos[:, None] - pos[None, :] < window)
        s = tl.where(see, s * scale_log2, float("-inf"))
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

    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(out_ptr + (q_start + i)[:, None] * stride_ot + h * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            query_start_loc: torch.Tensor, seq_lens: torch.Tensor, context_lens: torch.Tensor,
                            block_tables: torch.Tensor, block_size: int, scale: float,
                            sliding_window: int | None = None, max_query_len: int | None = None,
                            skip_single: bool = False, out: torch.Tensor | None = None,
                            block_m: int | None = None, block_n: int | None = None, num_warps: int = 4,
                            num_stages: int = 2) -> torch.Tensor:
    """Causal attention of q [T, H, D] over the paged caches [num_slots, kv_heads, D] (which already
    hold this step's keys/values). query_start_loc [B+1], seq_lens [B], context_lens [B] and
    block_tables [B, max_blocks] are int32. ``skip_single``: leave rows of one-token runs untouched
    in ``out`` (the caller computes them with the decode kernel). Returns [T, H, D] in q's dtype.
    ``block_m`` / ``block_n`` (query rows / keys a tile; default 64),
    ``num_warps`` and ``num_stages`` tune the kernel."""
    t, h, d = q.shape
    b = seq_lens.shape[0]
    kvh = k_cache.shape[1]
    if k_cache.dim() != 3 or k_cache.shape[2] != d or v_cache.shape != k_cache.shape or h % kvh:
        raise ValueError(f"caches {tuple(k_cache.shape)} do not fit q {tuple(q.shape)}; expected "
                         f"[num_slots, kv_heads, {d}] with kv_heads dividing {h}")
    if query_start_loc.shape != (b + 1,) or context_lens.shape != (b,) or block_tables.shape[0] != b:
        raise ValueError(f"query_start_loc {tuple(query_start_loc.shape)}, context_lens "
                         f"{tuple(context_lens.shape)} and block_tables {tuple(block_tables.shape)} "
                         f"do not describe the {b} sequences of seq_lens")
    if k_cache.stride(-1) != 1 or k_cache.stride() != v_cache.stride() or block_tables.stride(-1) != 1:
        raise ValueError("caches and block_tables must be contiguous in their last dimension, "
                         "and the key and value caches must share strides")
    if out is None:
        out = torch.empty_like(q)
    if t == 0 or b == 0:
        return out
    if q.stride(-1) != 1:
        q = q.contiguous()
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    block_m = block_m or 64
    block_n = block_n or 64
    grid = (triton.cdiv(max_query_len, block_m), b, h)
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, block_tables, query_start_loc, seq_lens, context_lens, scale * LOG2E,
        sliding_window or 0, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), block_tables.stride(0),
        GROUP=h // kvh, HEAD_DIM=d, BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=max(16, next_pow2(d)), WINDOWED=sliding_window is not None, SKIP_SINGLE=skip_single,
        IEEE=k_cache.dtype == torch.float32,
        num_warps=num_warps, num_stages=num_stages)
    return out


def paged_prefill_attention_ref(q, k_cache, v_cache, query_start_loc, seq_lens, context_lens, block_tables,
                                block_size, scale, sliding_window=None, max_query_len=None, **_) -> torch.Tensor:
    """Torch reference of :func:`paged_prefill_attention`: one sequence at a time, in float32. As in
    the kernel, sequence i's queries are rows query_start_loc[i]:query_start_loc[i+1] at positions
    from context_lens[i] on, and see the keys before seq_lens[i]; a row that sees none gets zeros."""
    out = torch.zeros_like(q)
    group = q.shape[1] // k_cache.shape[1]
    starts = query_start_loc.tolist()
    for i, (n, ctx) in enumerate(zip(seq_lens.tolist(), context_lens.tolist(), strict=True)):
        rows = slice(starts[i], starts[i + 1])
        if starts[i + 1] == starts[i]:
            continue
        kpos = torch.arange(n, device=q.device)
        qpos = torch.arange(ctx, ctx + starts[i + 1] - starts[i], device=q.device)
        slots = block_tables[i].long()[kpos // block_size] * block_size + kpos % block_size
        k = k_cache[slots].float().repeat_interleave(group, 1)   # [n, H, D]
        v = v_cache[slots].float().repeat_interleave(group, 1)
        s = torch.einsum("qhd,nhd->hqn", q[rows].float(), k) * scale
        see = kpos[None, :] <= qpos[:, None]
        if sliding_window is not None:
            see &= qpos[:, None] - kpos[None, :] < sliding_window
        p = s.masked_fill(~see, float("-inf")).softmax(-1).nan_to_num(0.0)
        out[rows] = torch.einsum("hqn,nhd->qhd", p, v).to(q.dtype)
    return out
