"""Decode attention of one token and the output projection after it, in one launch.

In a decode step of one sequence, attention (a few MB of keys and values at most) and the output
projection (one GEMV) are two kernels, and at batch 1 a kernel boundary costs about as much as the
work on either side of it. Here program (r, h) computes attention for kv head h (all its query
heads: the group shares one read of the keys and values) over the whole sequence, then multiplies
that head's slice of the attention output by its columns of ``o_proj`` for ``ROWS`` output rows:
a split-K GEMV whose K slices are the kv heads. The row block's last program (an atomic counter,
reset for the next launch) adds the slices' partial sums in head order, rounds, and adds the result
into the residual stream, so the result never depends on which program finished last.

Each kv head's attention is computed once per row block (the keys and values come from the L2
after the first read); the weights' first rows are read before the wait for the previous kernel.
A program reads every key of its sequence one tile after another, so this suits short and
moderate contexts: ``paged_decode_attention`` splits long sequences across programs instead.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_kernels._launch import counters, kernel, next_pow2
from deepinfer_kernels.gemv import EVICTION_POLICIES

LOG2E = 1.4426950408889634


@kernel(do_not_specialize=["window", "table_cols"])
def _attn_o_kernel(q_ptr, kc_ptr, vc_ptr, table_ptr, len_ptr, w_ptr, res_ptr, part_ptr, count_ptr,
                   scale_log2, window, table_cols, stride_cs, stride_ch, stride_w,
                   N: tl.constexpr, GROUP: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, KVH: tl.constexpr,
                   BLOCK_SIZE: tl.constexpr, BLOCK_KEYS: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                   WINDOWED: tl.constexpr, PDL: tl.constexpr, EVICT: tl.constexpr):
    rb = tl.program_id(0)
    h = tl.program_id(1)
    ty = res_ptr.dtype.element_ty
    g = tl.arange(0, GP)
    d = tl.arange(0, D)
    n = tl.arange(0, BLOCK_N)
    gmask = g < GROUP
    cols = (h * GROUP + g)[:, None] * D + d[None, :]  # this kv head's columns of o_proj, [GP, D]
    # the step's inputs (the length, the first tile's block-table entries) and the first rows'
    # weights never depend on the previous kernel: asked for before the wait
    seq_len = tl.load(len_ptr)
    pos0 = tl.arange(0, BLOCK_KEYS)
    blk0 = tl.load(table_ptr + pos0 // BLOCK_SIZE, mask=pos0 // BLOCK_SIZE < table_cols, other=0)
    rows0 = rb * ROWS + n
    w_at = w_ptr + cols[None, :, :]
    wmask0 = (rows0 < N)[:, None, None] & gmask[None, :, None]
    w0 = tl.load(w_at + rows0.to(tl.int64)[:, None, None] * stride_w, mask=wmask0, other=0.0, eviction_policy=EVICT)
    if PDL:
        tl.extra.cuda.gdc_wait()  # q and the newest key and value are the previous kernel's
        tl.extra.cuda.gdc_launch_dependents()
    q = tl.load(q_ptr + cols, mask=gmask[:, None], other=0.0).to(tl.float32)
    lo = 0
    if WINDOWED:
        lo = tl.maximum(seq_len - window, 0)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    for n0 in range((lo // BLOCK_KEYS) * BLOCK_KEYS, seq_len, BLOCK_KEYS):
        pos = n0 + tl.arange(0, BLOCK_KEYS)
        valid = (pos >= lo) & (pos < seq_len)
        if n0 == 0:
            blk = blk0
        else:
            blk = tl.load(table_ptr + pos // BLOCK_SIZE, mask=valid, other=0)
        slot = blk.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
        kv_off = slot[:, None] * stride_cs + h * stride_ch + d[None, :]
        k = tl.load(kc_ptr + kv_off, mask=valid[:, None], other=0.0).to(tl.float32)
        v = tl.load(vc_ptr + kv_off, mask=valid[:, None], other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], 2) * scale_log2  # [GP, BLOCK_KEYS]
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], 1)
        m_i = m_new
    # the attention output, rounded as the separate kernels store it
    a = (acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]).to(ty).to(tl.float32)
    mine = part_ptr + (rb * KVH + h) * ROWS
    tl.store(mine + n, tl.sum(tl.sum(w0.to(tl.float32) * a[None, :, :], 2), 1))
    for r in tl.static_range(1, ROWS // BLOCK_N):
        rows = rb * ROWS + r * BLOCK_N + n
        wmask = (rows < N)[:, None, None] & gmask[None, :, None]
        w = tl.load(w_at + rows.to(tl.int64)[:, None, None] * stride_w, mask=wmask, other=0.0, eviction_policy=EVICT)
        tl.store(mine + r * BLOCK_N + n, tl.sum(tl.sum(w.to(tl.float32) * a[None, :, :], 2), 1))
    tl.debug_barrier()  # every warp's partial is stored before the release below
    done = tl.atomic_add(count_ptr + rb, 1, sem="acq_rel")
    # the test is broadcast to a vector: the interpreter rejects a scalar in a mask
    last = (tl.zeros([BLOCK_N], tl.int32) + done) == KVH - 1
    for r in tl.static_range(0, ROWS // BLOCK_N):
        rows = rb * ROWS + r * BLOCK_N + n
        keep = last & (rows < N)
        y = tl.zeros([BLOCK_N], tl.float32)
        for i in tl.static_range(KVH):  # the kv heads' slices in order
            y += tl.load(part_ptr + (rb * KVH + i) * ROWS + r * BLOCK_N + n, mask=keep, other=0.0,
                         cache_modifier=".cg")
        res = tl.load(res_ptr + rows, mask=keep, other=0.0).to(tl.float32)
        tl.store(res_ptr + rows, (y.to(ty).to(tl.float32) + res).to(ty), mask=keep)
    tl.store(count_ptr + rb + n, tl.zeros([BLOCK_N], tl.int32), mask=last & (n == 0))


def attention_o_proj(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                     seq_len: torch.Tensor, block_size: int, scale: float, weight: torch.Tensor,
                     residual: torch.Tensor, sliding_window: int | None = None, rows: int = 128,
                     block_n: int = 32, block_keys: int = 64, num_warps: int = 8, pdl: bool = False,
                     evict: str = "") -> torch.Tensor:
    """``residual += attention(q) @ weight.T`` for the one token of one sequence, in place.

    q [1, H, D] (the token at position seq_len - 1); caches [num_slots, KV, D]; block_table
    [1, max_blocks] int32; seq_len [1] int32 (device); weight (o_proj) [N, H * D]; residual
    [1, N]. ``rows``: output rows a program (a multiple of ``block_n``, the rows it multiplies at
    once); ``block_keys``: keys a tile. ``pdl`` as in ``gemv``: the length, the block table and the
    weights must not be the previous kernel's output. ``evict``: the weights' L2 policy (``gemv``).
    Returns residual."""
    _, h, d = q.shape
    kvh = k_cache.shape[1]
    n = weight.shape[0]
    if q.dim() != 3 or q.shape[0] != 1 or k_cache.dim() != 3 or k_cache.shape[1:] != (kvh, d) or h % kvh \
            or v_cache.shape != k_cache.shape or v_cache.stride() != k_cache.stride() or k_cache.stride(2) != 1:
        raise ValueError(f"attention_o_proj takes q [1, H, D] and caches [num_slots, KV, D] (H a multiple of KV, "
                         f"equal strides, D contiguous); got q {tuple(q.shape)}, caches {tuple(k_cache.shape)} / "
                         f"{tuple(v_cache.shape)}")
    if weight.dim() != 2 or weight.shape[1] != h * d or weight.stride(1) != 1 or residual.shape != (1, n) \
            or not residual.is_contiguous() or weight.dtype != residual.dtype:
        raise ValueError(f"attention_o_proj takes o_proj [N, {h * d}] (rows contiguous) and a contiguous residual "
                         f"[1, N] of its dtype; got {tuple(weight.shape)} {weight.dtype}, residual "
                         f"{tuple(residual.shape)} {residual.dtype}")
    if block_table.dim() != 2 or block_table.shape[0] != 1 or block_table.stride(1) != 1 or seq_len.shape != (1,):
        raise ValueError(f"attention_o_proj takes one sequence: block_table [1, max_blocks], seq_len [1]; got "
                         f"{tuple(block_table.shape)}, {tuple(seq_len.shape)}")
    if d & (d - 1) or rows % block_n or block_n & (block_n - 1) or block_keys & (block_keys - 1):
        raise ValueError(f"attention_o_proj needs a power-of-two head_dim (got {d}), power-of-two block_n "
                         f"({block_n}) and block_keys ({block_keys}), and rows ({rows}) a multiple of block_n")
    if evict not in EVICTION_POLICIES:
        raise ValueError(f"attention_o_proj's evict must be one of {EVICTION_POLICIES}; got {evict!r}")
    group = h // kvh
    blocks = triton.cdiv(n, rows)
    part = torch.empty(blocks * kvh * rows, dtype=torch.float32, device=q.device)
    count = counters(q.device, blocks + block_n, "attn_o")
    q = q.contiguous()
    _attn_o_kernel[(blocks, kvh)](
        q, k_cache, v_cache, block_table, seq_len, weight, residual, part, count, scale * LOG2E,
        sliding_window or 0, block_table.shape[1], k_cache.stride(0), k_cache.stride(1), weight.stride(0),
        N=n, GROUP=group, GP=next_pow2(group), D=d, KVH=kvh, BLOCK_SIZE=block_size, BLOCK_KEYS=block_keys,
        ROWS=rows, BLOCK_N=block_n, WINDOWED=sliding_window is not None, PDL=pdl, EVICT=evict,
        num_warps=num_warps)
    return residual


def attention_o_proj_ref(q, k_cache, v_cache, block_table, seq_len, block_size, scale, weight, residual,
                         sliding_window=None, rows=128, block_n=32, block_keys=64, num_warps=8, pdl=False,
                         evict=""):
    """Torch reference of :func:`attention_o_proj`: the separate attention and residual GEMV."""
    from deepinfer_kernels.gemv import gemv_ref
    from deepinfer_kernels.paged_attention import paged_decode_attention_ref

    out = paged_decode_attention_ref(q, k_cache, v_cache, block_table, seq_len, block_size, scale, sliding_window)
    return gemv_ref(out.reshape(1, -1), weight, residual=residual)
