"""Single-token projections (GEMV) with the layer's neighbouring steps folded in.

A decode step of one sequence multiplies a single row x [1, K] by each weight [N, K]: pure weight
reads, which cuBLAS serves at well below the memory bandwidth on small matrices, with a separate
small kernel before and after each one (RMSNorm, rotary, SiLU-mul, residual add). Here one kernel
does each projection with its neighbours:

- ``gemv(x, w, norm_weight=...)``: RMSNorm of x first (every program normalises the row itself:
  x is a few KiB and stays in L2);
- ``gemv(x, w, residual=r)``: ``r += x @ w.T`` in place (the residual stream's add);
- ``gemv(x, w, norm_weight=..., silu_mul=True)``: w is gate | up [2I, K]; returns silu(gate) * up;
- ``gemv_qkv_rotary``: the fused qkv projection with the input norm, Qwen3's per-head q/k norm and
  the rotary embedding of q and k.

Each program multiplies BLOCK_N rows (for paired outputs, BLOCK_N rows and their partners: gate
and up, or the two halves of a rotary head) over one of SPLIT_K slices of K. With SPLIT_K > 1 the
programs of a row block write float32 partials, and the last of them to finish (an atomic counter,
which it resets for the next launch) adds them in slice order and applies the epilogue: so the
result never depends on which program finished last, and one launch does everything.

Rounding follows the eager layers: the projection's output is rounded to the dtype before the
epilogue, the norm, rotary and SiLU-mul round where the eager ops do, and ``r + y`` is rounded once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from deepinfer_kernels._launch import counters, kernel, next_pow2

_PLAIN, _SILU_MUL, _ROTARY = 0, 1, 2
LOG2E = 1.4426950408889634


@kernel
def _gemv_kernel(x_ptr, w_ptr, out_ptr, nw_ptr, res_ptr, part_ptr, count_ptr,
                 cos_ptr, sin_ptr, pos_ptr, qn_ptr, kn_ptr, kc_ptr, vc_ptr, slot_ptr,
                 ao_ptr, bt_ptr, sl_ptr, acount_ptr, scale_log2, window,
                 eps, qk_eps, stride_w, stride_cp, stride_cs, stride_ch,
                 N: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, MODE: tl.constexpr, PAIR: tl.constexpr,
                 HALF: tl.constexpr, ROT_ROWS: tl.constexpr, Q_ROWS: tl.constexpr,
                 NORM: tl.constexpr, RESIDUAL: tl.constexpr, QK_NORM: tl.constexpr, KV_WRITE: tl.constexpr,
                 D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                 K_SLICE: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr,
                 ATTEND: tl.constexpr, GROUP: tl.constexpr, PAGE: tl.constexpr, A_BLOCK_N: tl.constexpr,
                 A_BLOCK_G: tl.constexpr, A_BLOCK_D: tl.constexpr, A_STAGES: tl.constexpr,
                 WINDOWED: tl.constexpr, IEEE: tl.constexpr):
    b = tl.program_id(0)
    s = tl.program_id(1)
    ty = x_ptr.dtype.element_ty
    n = tl.arange(0, BLOCK_N)
    if MODE == 2:  # BLOCK_N rows of one head's first half; their partners are HALF rows on
        j = (b % (HALF // BLOCK_N)) * BLOCK_N + n
        if ATTEND:  # a kv head's programs run together: its q heads', then its k's and its v's
            grp = b // ((HALF // BLOCK_N) * (GROUP + 2))
            hi = (b // (HALF // BLOCK_N)) % (GROUP + 2)
            head = tl.where(hi < GROUP, grp * GROUP + hi,
                            tl.where(hi == GROUP, Q_ROWS // D + grp, ROT_ROWS // D + grp))
            r1 = head * (2 * HALF) + j
        else:
            r1 = (b // (HALF // BLOCK_N)) * (2 * HALF) + j
    else:
        j = n
        r1 = b * BLOCK_N + n
    rmask = r1 < N
    w1_rows = w_ptr + r1.to(tl.int64)[:, None] * stride_w
    w2_rows = w_ptr + (r1 + PAIR).to(tl.int64)[:, None] * stride_w
    # with PREFETCH, weights are read one tile ahead of their use, the first tile before waiting
    # for the previous kernel (with PDL this launch starts while it finishes; weights never depend
    # on it)
    k_lo = s * K_SLICE
    kr = tl.arange(0, BLOCK_K)
    if PREFETCH:
        kk = k_lo + kr
        m2 = rmask[:, None] & ((kk < K) & (kr < K_SLICE))[None, :]
        w1 = tl.load(w1_rows + kk[None, :], mask=m2, other=0.0)
        w2 = tl.load(w2_rows + kk[None, :], mask=m2 & (MODE != 0), other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()  # x, the residual and the counters are the previous kernel's
        tl.extra.cuda.gdc_launch_dependents()
    if NORM:  # the input RMSNorm's scale, over the whole row
        xs = tl.arange(0, KP)
        xf = tl.load(x_ptr + xs, mask=xs < K, other=0.0).to(tl.float32)
        inv = tl.rsqrt(tl.sum(xf * xf, 0) / K + eps)
    acc1 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, K_SLICE, BLOCK_K):
        kk = k_lo + k0 + kr
        kmask = (kk < K) & (k0 + kr < K_SLICE)
        if PREFETCH:
            nk = kk + BLOCK_K  # the next tile's columns
            nm2 = rmask[:, None] & ((nk < K) & (k0 + BLOCK_K + kr < K_SLICE))[None, :]
            w1_next = tl.load(w1_rows + nk[None, :], mask=nm2, other=0.0)
            w2_next = tl.load(w2_rows + nk[None, :], mask=nm2 & (MODE != 0), other=0.0)
        else:
            m2 = rmask[:, None] & kmask[None, :]
            w1 = tl.load(w1_rows + kk[None, :], mask=m2, other=0.0)
            w2 = tl.load(w2_rows + kk[None, :], mask=m2 & (MODE != 0), other=0.0)
        xk = tl.load(x_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
        if NORM:
            wn = tl.load(nw_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
            xk = ((xk * inv).to(ty).to(tl.float32) * wn).to(ty).to(tl.float32)
        acc1 += w1.to(tl.float32) * xk[None, :]
        if MODE != 0:
            acc2 += w2.to(tl.float32) * xk[None, :]
        if PREFETCH:
            w1 = w1_next
            w2 = w2_next
    y1 = tl.sum(acc1, 1)
    y2 = tl.sum(acc2, 1)
    omask = rmask
    if SPLIT_K > 1:  # partials out; the row block's last program sums them in slice order
        mine = part_ptr + (b * SPLIT_K + s) * (2 * BLOCK_N)
        tl.store(mine + n, y1)
        tl.store(mine + BLOCK_N + n, y2)
        tl.debug_barrier()  # every warp's partial is stored before the release below
        done = tl.atomic_add(count_ptr + b, 1, sem="acq_rel")
        # the test is broadcast to a vector: the interpreter rejects a scalar in a mask
        last = (tl.zeros([BLOCK_N], tl.int32) + done) == SPLIT_K - 1
        y1 = tl.zeros([BLOCK_N], tl.float32)
        y2 = tl.zeros([BLOCK_N], tl.float32)
        for i in tl.static_range(SPLIT_K):
            theirs = part_ptr + (b * SPLIT_K + i) * (2 * BLOCK_N)
            y1 += tl.load(theirs + n, mask=last, other=0.0, cache_modifier=".cg")
            y2 += tl.load(theirs + BLOCK_N + n, mask=last, other=0.0, cache_modifier=".cg")
        tl.store(count_ptr + b + n, tl.zeros([BLOCK_N], tl.int32), mask=last & (n == 0))
        omask = rmask & last
    y1 = y1.to(ty).to(tl.float32)  # the projection's output, rounded as the eager matmul's is
    y2 = y2.to(ty).to(tl.float32)
    if MODE == 1:  # silu(gate) * up
        act = (y1 / (1.0 + tl.exp(-y1))).to(ty).to(tl.float32)
        tl.store(out_ptr + r1, (act * y2).to(ty), mask=omask)
    elif MODE == 2:
        rot = r1 < ROT_ROWS  # q and k heads turn; v heads are stored as they are
        if QK_NORM:  # BLOCK_N == HALF: the program holds the whole head
            hinv = tl.rsqrt((tl.sum(y1 * y1, 0) + tl.sum(y2 * y2, 0)) / (2 * HALF) + qk_eps)
            is_q = r1 < Q_ROWS
            g1 = tl.where(is_q, tl.load(qn_ptr + j).to(tl.float32), tl.load(kn_ptr + j).to(tl.float32))
            g2 = tl.where(is_q, tl.load(qn_ptr + HALF + j).to(tl.float32), tl.load(kn_ptr + HALF + j).to(tl.float32))
            y1 = tl.where(rot, ((y1 * hinv).to(ty).to(tl.float32) * g1).to(ty).to(tl.float32), y1)
            y2 = tl.where(rot, ((y2 * hinv).to(ty).to(tl.float32) * g2).to(ty).to(tl.float32), y2)
        p = tl.load(pos_ptr).to(tl.int64)
        c1 = tl.load(cos_ptr + p * stride_cp + j).to(tl.float32)
        c2 = tl.load(cos_ptr + p * stride_cp + HALF + j).to(tl.float32)
        s1 = tl.load(sin_ptr + p * stride_cp + j).to(tl.float32)
        s2 = tl.load(sin_ptr + p * stride_cp + HALF + j).to(tl.float32)
        o1 = (y1 * c1).to(ty).to(tl.float32) + (-y2 * s1).to(ty).to(tl.float32)
        o2 = (y2 * c2).to(ty).to(tl.float32) + (y1 * s2).to(ty).to(tl.float32)
        o1 = tl.where(rot, o1, y1).to(ty)
        o2 = tl.where(rot, o2, y2).to(ty)
        tl.store(out_ptr + r1, o1, mask=omask)
        tl.store(out_ptr + r1 + HALF, o2, mask=omask)
        if KV_WRITE:  # k and v heads also go straight into the paged cache, at the token's slot
            slot = tl.load(slot_ptr).to(tl.int64)
            kv_head = r1 // D - Q_ROWS // D  # k heads 0.., then v heads 0..
            kv_n = (ROT_ROWS - Q_ROWS) // D
            keep = omask & (r1 >= Q_ROWS) & ((tl.zeros([BLOCK_N], tl.int64) + slot) >= 0)
            is_v = kv_head >= kv_n
            at = slot * stride_cs + tl.where(is_v, kv_head - kv_n, kv_head) * stride_ch + r1 % D
            kd = kc_ptr.dtype.element_ty
            tl.store(kc_ptr + at, o1.to(kd), mask=keep & ~is_v)
            tl.store(kc_ptr + at + HALF, o2.to(kd), mask=keep & ~is_v)
            tl.store(vc_ptr + at, o1.to(kd), mask=keep & is_v)
            tl.store(vc_ptr + at + HALF, o2.to(kd), mask=keep & is_v)
        if ATTEND:  # the kv head's last program to finish attends for its q heads (see QkvAttention)
            if SPLIT_K > 1:
                arrived = done == SPLIT_K - 1  # only a row block's last program has stored anything
            else:
                arrived = b >= 0
            if arrived:
                tl.debug_barrier()  # every warp's stores are made before the release below
                if tl.atomic_add(acount_ptr + grp, 1, sem="acq_rel") == (HALF // BLOCK_N) * (GROUP + 2) - 1:
                    seq_len = tl.load(sl_ptr)
                    lo = 0
                    if WINDOWED:
                        lo = tl.maximum(seq_len - window, 0)
                    ga = tl.arange(0, A_BLOCK_G)
                    da = tl.arange(0, A_BLOCK_D)
                    heads = grp * GROUP + ga
                    q_mask = (ga[:, None] < GROUP) & (da[None, :] < D)
                    dot_ty = kc_ptr.dtype.element_ty  # as the decode kernel: operands in the cache's dtype
                    q = tl.load(out_ptr + heads[:, None] * D + da[None, :], mask=q_mask, other=0.0,
                                cache_modifier=".cg").to(dot_ty)
                    m_i = tl.full([A_BLOCK_G], float("-inf"), tl.float32)
                    l_i = tl.zeros([A_BLOCK_G], tl.float32)
                    acc = tl.zeros([A_BLOCK_G, A_BLOCK_D], tl.float32)
                    for n0 in tl.range((lo // A_BLOCK_N) * A_BLOCK_N, seq_len, A_BLOCK_N, num_stages=A_STAGES):
                        key = n0 + tl.arange(0, A_BLOCK_N)
                        valid = (key >= lo) & (key < seq_len)
                        page = tl.load(bt_ptr + key // PAGE, mask=valid, other=0)
                        kv_at = (page.to(tl.int64) * PAGE + key % PAGE)[:, None] * stride_cs + grp * stride_ch \
                            + da[None, :]
                        kv_mask = valid[:, None] & (da[None, :] < D)
                        kt = tl.load(kc_ptr + kv_at, mask=kv_mask, other=0.0, cache_modifier=".cg")
                        vt = tl.load(vc_ptr + kv_at, mask=kv_mask, other=0.0, cache_modifier=".cg")
                        if IEEE:  # float32 caches: full-precision products, not TF32
                            sc = tl.dot(q, tl.trans(kt), input_precision="ieee")
                        else:
                            sc = tl.dot(q, tl.trans(kt))
                        sc = tl.where(valid[None, :], sc * scale_log2, float("-inf"))
                        m_new = tl.maximum(m_i, tl.max(sc, 1))
                        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                        alpha = tl.exp2(m_i - m_safe)
                        p = tl.exp2(sc - m_safe[:, None])
                        l_i = l_i * alpha + tl.sum(p, 1)
                        if IEEE:
                            pv = tl.dot(p, vt, input_precision="ieee")
                        else:
                            pv = tl.dot(p.to(dot_ty), vt)
                        acc = acc * alpha[:, None] + pv
                        m_i = m_new
                    res = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
                    tl.store(ao_ptr + heads[:, None] * D + da[None, :], res.to(ty), mask=q_mask)
                    tl.store(acount_ptr + grp, 0)  # zero again for the next launch
    elif RESIDUAL:
        r = tl.load(res_ptr + r1, mask=omask, other=0.0).to(tl.float32)
        tl.store(res_ptr + r1, (y1 + r).to(ty), mask=omask)
    else:
        tl.store(out_ptr + r1, y1.to(ty), mask=omask)


@dataclass(frozen=True)
class GemvConfig:
    """Tile of one program: ``block_n`` output rows (pairs, in the paired modes) by ``block_k``
    columns a loop step, over one of ``split_k`` slices of K; ``prefetch``: load each weight tile
    one step ahead of its use."""

    block_n: int
    block_k: int
    split_k: int
    num_warps: int = 4
    prefetch: bool = True


_SM_COUNT: dict[int, int] = {}
PREFETCH = True  # default_config's choice (H200: see docs/benchmarks.md)


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: a few programs, so that split K is exercised there too
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def default_config(rows: int, k: int, device: torch.device, paired: bool = False,
                   row_quantum: int | None = None, block_n: int | None = None) -> GemvConfig:
    """The tile for ``rows`` output rows (pairs when ``paired``) over K = ``k``.

    From the H200 sweeps (benchmarks/h200_gemv_sweep.py, then h200_gemv_tiles.py, which times
    each projection as 16 launches with PDL, as a decode step runs them; docs/benchmarks.md):
    plain rows 4 a program by 2,048 columns a step (8 warps; 4 when K is longer), or 8 by 1,024
    with 8 warps when K is over 2,048 and at least twice N (down); pairs 2 a program by 512
    columns, or 8 by 256 with 4 warps when there are many (gate/up). K is split only when there
    are fewer row blocks than SMs.
    ``row_quantum``: block_n must divide it (a rotary half-head). ``block_n``: fixed by the caller
    (whole heads for the q/k norm); the step then keeps the tile at 4,096 weights or fewer.
    """
    if paired:
        bn, block_k, warps = (8, 256, 4) if rows >= 4096 else (2, 512, 4)
    else:
        # down (K several times N): 8 by 1,024; the others (o, and any plain projection) 4 by 2,048
        bn, block_k, warps = (8, 1024, 8) if k > 2048 and k >= 2 * rows else (4, 2048, 8 if k <= 2048 else 4)
    if block_n is not None:
        block_k = max(16, min(block_k, 4096 // next_pow2(block_n)))
    else:
        block_n = bn
    if row_quantum is not None:
        block_n = min(block_n, row_quantum)
        while row_quantum % block_n:
            block_n //= 2
    block_k = min(block_k, next_pow2(k))
    blocks = triton.cdiv(rows, block_n)
    split = 1
    while blocks * split < _sm_count(device) and k // (split * 2) >= min(block_k, 256) and split < 16:
        split *= 2
    block_k = min(block_k, next_pow2(triton.cdiv(k, split)))
    return GemvConfig(block_n, block_k, split, warps, PREFETCH)


def _check(x: torch.Tensor, weight: torch.Tensor, name: str) -> None:
    if x.dim() != 2 or x.shape[0] != 1 or weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"{name} takes one row x [1, K] and a weight [N, K]; got x {tuple(x.shape)}, "
                         f"weight {tuple(weight.shape)}")
    if weight.dtype != x.dtype or weight.device != x.device:
        raise ValueError(f"{name}: the weight is {weight.dtype} on {weight.device}, x is {x.dtype} on "
                         f"{x.device}; they must match")
    if weight.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError(f"{name} needs a weight and x contiguous along K")


def _launch(x, weight, out, rows, cfg: GemvConfig, mode, pair, *, norm_weight=None, eps=1e-6, residual=None,
            rotary=None, kv_write=None, attend=None, pdl=False):
    k = x.shape[1]
    if cfg.split_k < 1 or cfg.block_n < 1 or cfg.block_k < 1:
        raise ValueError(f"a GEMV tile needs positive sizes; got {cfg}")
    blocks = triton.cdiv(rows, cfg.block_n)
    k_slice = triton.cdiv(k, cfg.split_k)
    if cfg.split_k > 1:
        part = torch.empty(blocks * cfg.split_k * 2 * cfg.block_n, dtype=torch.float32, device=x.device)
        count = counters(x.device, blocks + cfg.block_n, "gemv")
    else:
        part = count = out
    cos, sin, pos, qn, kn, qk_eps, half, rot_rows, q_rows = rotary or (x, x, x, x, x, 0.0, 1, 0, 0)
    kc, vc, slot = kv_write or (x, x, x)
    ao, at, a_count, group, a_block_n = attend or (x, None, x, 1, 16)
    _gemv_kernel[(blocks, cfg.split_k)](
        x, weight, out, norm_weight if norm_weight is not None else x, residual if residual is not None else x,
        part, count, cos, sin, pos, qn if qn is not None else x, kn if kn is not None else x, kc, vc, slot,
        ao, at.block_tables if at else x, at.seq_lens if at else x, a_count, at.scale * LOG2E if at else 0.0,
        (at.sliding_window or 0) if at else 0, eps, qk_eps, weight.stride(0), cos.stride(0) if rotary else 0, kc.stride(0) if kv_write else 0,
        kc.stride(1) if kv_write else 0,
        N=(rows if mode != _ROTARY else weight.shape[0]), K=k, KP=next_pow2(k), MODE=mode, PAIR=pair, HALF=half,
        ROT_ROWS=rot_rows, Q_ROWS=q_rows, NORM=norm_weight is not None, RESIDUAL=residual is not None,
        QK_NORM=qn is not None, KV_WRITE=kv_write is not None, D=2 * half, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k, K_SLICE=k_slice, PDL=pdl, PREFETCH=cfg.prefetch,
        ATTEND=at is not None, GROUP=group, PAGE=at.block_size if at else 1, A_BLOCK_N=a_block_n,
        A_BLOCK_G=max(16, next_pow2(group)), A_BLOCK_D=max(16, next_pow2(2 * half)),
        A_STAGES=at.num_stages if at else 1, WINDOWED=bool(at and at.sliding_window is not None),
        IEEE=kc.dtype == torch.float32, num_warps=cfg.num_warps)


def gemv(x: torch.Tensor, weight: torch.Tensor, *, norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
         residual: torch.Tensor | None = None, silu_mul: bool = False,
         config: GemvConfig | None = None, pdl: bool = False) -> torch.Tensor:
    """``x @ weight.T`` for one row x [1, K], weight [N, K].

    ``norm_weight`` [K]: RMS-normalise x first (eps). ``residual`` [1, N]: add the product into it
    in place and return it. ``silu_mul``: weight is gate | up [2I, K]; returns silu(gate) * up [1, I].
    ``pdl``: launch with programmatic dependent launch (see ``_launch.pdl_supported``): the kernel may
    start while the previous one finishes, reads its weights, then waits for that kernel.
    """
    _check(x, weight, "gemv")
    n, k = weight.shape
    if norm_weight is not None and norm_weight.shape != (k,):
        raise ValueError(f"gemv: norm_weight must be [{k}]; got {tuple(norm_weight.shape)}")
    if silu_mul:
        if residual is not None or n % 2:
            raise ValueError(f"gemv: silu_mul takes gate | up [2I, K] (got N = {n}) and no residual")
        rows, mode, pair = n // 2, _SILU_MUL, n // 2
    else:
        rows, mode, pair = n, _PLAIN, 0
    if residual is not None and (residual.shape != (1, n) or residual.dtype != x.dtype or not residual.is_contiguous()):
        raise ValueError(f"gemv: residual must be a contiguous [1, {n}] {x.dtype}; got "
                         f"{tuple(residual.shape)} {residual.dtype}")
    cfg = config or default_config(rows, k, x.device, paired=silu_mul)
    out = residual if residual is not None else torch.empty(1, rows, dtype=x.dtype, device=x.device)
    _launch(x, weight, out, rows, cfg, mode, pair, norm_weight=norm_weight, eps=eps, residual=residual, pdl=pdl)
    return out
