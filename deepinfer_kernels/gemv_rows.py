"""Projections of a few rows (2-16 tokens: a verification of drafts, a small decode batch) with the
layer's neighbouring steps folded in, as ``gemv`` does for one row.

A step of a few tokens otherwise runs each projection as a cuBLAS matmul with a separate small
kernel before and after it (RMSNorm, rotary and the KV write, SiLU-mul, residual add): about ten
kernels a layer, where ``gemv`` needs four for one token. Here each program multiplies BLOCK_N
weight rows (pairs, in the paired modes) by every token's row, all of K, on the tensor cores (the
tokens padded to 16 columns), and applies the epilogue to its outputs of every token:

- ``gemv_rows(x, w, norm_weight=...)``: RMSNorm of each row of x first;
- ``gemv_rows(x, w, residual=r)``: ``r += x @ w.T`` in place;
- ``gemv_rows(x, w, norm_weight=..., silu_mul=True)``: w is gate | up [2I, K]; returns silu(gate) * up;
- ``gemv_rows_qkv_rotary``: the fused qkv projection with the input norm, Qwen3's per-head q/k norm,
  the rotary embedding at each token's position and, optionally, the key and value written into
  the paged cache at each token's slot.

Rounding follows the eager layers, as in ``gemv``: the projection's output is rounded to the dtype
before the epilogue, and ``r + y`` is rounded once. A token's result does not depend on the other
tokens (every column of the product sums over K in the same order), only on the tile.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from deepinfer_kernels._launch import kernel, next_pow2
from deepinfer_kernels.gemv import EVICTION_POLICIES, gemv_qkv_rotary_ref, gemv_ref

MAX_ROWS = 16  # the tokens a launch takes (the tensor cores' narrowest tile)
_PLAIN, _SILU_MUL, _ROTARY = 0, 1, 2


@kernel
def _rows_kernel(x_ptr, w_ptr, out_ptr, nw_ptr, res_ptr, cos_ptr, sin_ptr, pos_ptr, qn_ptr, kn_ptr,
                 kc_ptr, vc_ptr, slot_ptr, M, eps, qk_eps, stride_w, stride_cp, stride_cs, stride_ch,
                 N: tl.constexpr, K: tl.constexpr, MODE: tl.constexpr, PAIR: tl.constexpr,
                 HALF: tl.constexpr, ROT_ROWS: tl.constexpr, Q_ROWS: tl.constexpr, NORM: tl.constexpr,
                 RESIDUAL: tl.constexpr, QK_NORM: tl.constexpr, KV_WRITE: tl.constexpr, D: tl.constexpr,
                 MP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
                 PDL: tl.constexpr, EVICT: tl.constexpr):
    b = tl.program_id(0)
    ty = x_ptr.dtype.element_ty
    n = tl.arange(0, BLOCK_N)
    m = tl.arange(0, MP)
    mmask = m < M
    if MODE == 2:  # BLOCK_N rows of one head's first half; their partners are HALF rows on
        j = (b % (HALF // BLOCK_N)) * BLOCK_N + n
        r1 = (b // (HALF // BLOCK_N)) * (2 * HALF) + j
    else:
        j = n
        r1 = b * BLOCK_N + n
    rmask = r1 < N
    omask = rmask[:, None] & mmask[None, :]  # [BLOCK_N, MP]: outputs by weight row and token
    at_out = m[None, :] * N + r1[:, None]  # x, the output and the residual are contiguous rows
    w1_rows = w_ptr + r1.to(tl.int64)[:, None] * stride_w
    w2_rows = w_ptr + (r1 + PAIR).to(tl.int64)[:, None] * stride_w
    kr = tl.arange(0, BLOCK_K)
    if PDL:
        tl.extra.cuda.gdc_wait()  # x and the residual are the previous kernel's
        tl.extra.cuda.gdc_launch_dependents()
    if RESIDUAL:
        r = tl.load(res_ptr + at_out, mask=omask, other=0.0).to(tl.float32)
    if MODE == 2:
        p = tl.load(pos_ptr + m, mask=mmask, other=0).to(tl.int64)
        at_c = p[None, :] * stride_cp + j[:, None]
        c1 = tl.load(cos_ptr + at_c, mask=omask, other=0.0).to(tl.float32)
        c2 = tl.load(cos_ptr + at_c + HALF, mask=omask, other=0.0).to(tl.float32)
        s1 = tl.load(sin_ptr + at_c, mask=omask, other=0.0).to(tl.float32)
        s2 = tl.load(sin_ptr + at_c + HALF, mask=omask, other=0.0).to(tl.float32)
        if KV_WRITE:
            slot = tl.load(slot_ptr + m, mask=mmask, other=-1).to(tl.int64)
    if NORM:  # each row's RMSNorm scale, over the whole row (in BLOCK_K steps: all of [16, K] at
        ss = tl.zeros([MP], tl.float32)  # once would not fit a program's registers for large K)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + kr
            xf = tl.load(x_ptr + m[:, None] * K + kk[None, :], mask=mmask[:, None] & (kk < K)[None, :],
                         other=0.0).to(tl.float32)
            ss += tl.sum(xf * xf, 1)
        inv = tl.rsqrt(ss / K + eps)
    acc1 = tl.zeros([BLOCK_N, MP], tl.float32)
    acc2 = tl.zeros([BLOCK_N, MP], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + kr
        kmask = kk < K
        wm = rmask[:, None] & kmask[None, :]
        w1 = tl.load(w1_rows + kk[None, :], mask=wm, other=0.0, eviction_policy=EVICT)
        xk = tl.load(x_ptr + m[:, None] * K + kk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
        if NORM:
            wn = tl.load(nw_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
            xk = ((xk.to(tl.float32) * inv[:, None]).to(ty).to(tl.float32) * wn[None, :]).to(ty)
        xt = tl.trans(xk)  # [BLOCK_K, MP]
        if IEEE:  # float32 weights: no TF32 rounding of the inputs
            acc1 = tl.dot(w1, xt, acc1, input_precision="ieee")
        else:
            acc1 = tl.dot(w1, xt, acc1)
        if MODE != 0:
            w2 = tl.load(w2_rows + kk[None, :], mask=wm, other=0.0, eviction_policy=EVICT)
            if IEEE:
                acc2 = tl.dot(w2, xt, acc2, input_precision="ieee")
            else:
                acc2 = tl.dot(w2, xt, acc2)
    y1 = acc1.to(ty).to(tl.float32)  # the projection's output, rounded as the eager matmul's is
    y2 = acc2.to(ty).to(tl.float32)
    if MODE == 1:  # silu(gate) * up
        act = (y1 / (1.0 + tl.exp(-y1))).to(ty).to(tl.float32)
        tl.store(out_ptr + at_out, (act * y2).to(ty), mask=omask)
    elif MODE == 2:
        rot = (r1 < ROT_ROWS)[:, None]  # q and k heads turn; v heads are stored as they are
        if QK_NORM:  # BLOCK_N == HALF: the program holds the whole head of every token
            hinv = tl.rsqrt((tl.sum(y1 * y1, 0) + tl.sum(y2 * y2, 0)) / (2 * HALF) + qk_eps)
            is_q = r1 < Q_ROWS
            g1 = tl.where(is_q, tl.load(qn_ptr + j).to(tl.float32), tl.load(kn_ptr + j).to(tl.float32))
            g2 = tl.where(is_q, tl.load(qn_ptr + HALF + j).to(tl.float32), tl.load(kn_ptr + HALF + j).to(tl.float32))
            y1 = tl.where(rot, ((y1 * hinv[None, :]).to(ty).to(tl.float32) * g1[:, None]).to(ty).to(tl.float32), y1)
            y2 = tl.where(rot, ((y2 * hinv[None, :]).to(ty).to(tl.float32) * g2[:, None]).to(ty).to(tl.float32), y2)
        o1 = (y1 * c1).to(ty).to(tl.float32) + (-y2 * s1).to(ty).to(tl.float32)
        o2 = (y2 * c2).to(ty).to(tl.float32) + (y1 * s2).to(ty).to(tl.float32)
        o1 = tl.where(rot, o1, y1).to(ty)
        o2 = tl.where(rot, o2, y2).to(ty)
        tl.store(out_ptr + at_out, o1, mask=omask)
        tl.store(out_ptr + at_out + HALF, o2, mask=omask)
        if KV_WRITE:  # k and v heads also go straight into the paged cache, at each token's slot
            kv_head = r1 // D - Q_ROWS // D  # k heads 0.., then v heads 0..
            kv_n = (ROT_ROWS - Q_ROWS) // D
            keep = omask & (r1 >= Q_ROWS)[:, None] & (slot >= 0)[None, :]
            is_v = (kv_head >= kv_n)[:, None]
            at = slot[None, :] * stride_cs + (tl.where(kv_head >= kv_n, kv_head - kv_n, kv_head) * stride_ch
                                              + r1 % D)[:, None]
            kd = kc_ptr.dtype.element_ty
            tl.store(kc_ptr + at, o1.to(kd), mask=keep & ~is_v)
            tl.store(kc_ptr + at + HALF, o2.to(kd), mask=keep & ~is_v)
            tl.store(vc_ptr + at, o1.to(kd), mask=keep & is_v)
            tl.store(vc_ptr + at + HALF, o2.to(kd), mask=keep & is_v)
    elif RESIDUAL:
        tl.store(res_ptr + at_out, (y1 + r).to(ty), mask=omask)
    else:
        tl.store(out_ptr + at_out, y1.to(ty), mask=omask)


@dataclass(frozen=True)
class RowsConfig:
    """Tile of one program: ``block_n`` weight rows (pairs, in the paired modes; at least 16) by
    ``block_k`` columns a loop step (at least 16)."""

    block_n: int = 16
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 3


# The most weights a projection may have for its steps of a few tokens to come here. A program reads
# all of K for its 16 rows, and such programs read the weights at about half cuBLAS's rate once the
# weights are large: on the H200 (a probe in git history at d2f3059, 16 layers in a graph) the demo
# target's projections (at most 0.8 M weights) take 30-80 us against cuBLAS's 48-62 us before its
# separate norm, rotary, SiLU-mul and residual kernels, while Llama-3.2-1B's qkv (6.3 M) takes 191
# us against 107 and its gate/up (33.5 M) 495 against 293. Where the weights are this small a step
# of a few tokens is bound by its kernels' count, not by reading the weights.
ROWS_MAX_WEIGHTS = 1 << 22


def rows_supported(head_dim: int | None = None, weights: int | None = None) -> bool:
    """Whether a model can take its steps of a few tokens here: the rotary tile holds 16 rows of a
    half head, so heads of a multiple of 32 (None: no rotary projection asked about), and its
    largest projection has at most ``ROWS_MAX_WEIGHTS`` weights (None: not asked about)."""
    return (head_dim is None or head_dim % 32 == 0) and (weights is None or weights <= ROWS_MAX_WEIGHTS)


def _check(x: torch.Tensor, weight: torch.Tensor, name: str) -> None:
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS or weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"{name} takes 1 to {MAX_ROWS} rows x [M, K] and a weight [N, K]; got x "
                         f"{tuple(x.shape)}, weight {tuple(weight.shape)}")
    if weight.dtype != x.dtype or weight.device != x.device:
        raise ValueError(f"{name}: the weight is {weight.dtype} on {weight.device}, x is {x.dtype} on "
                         f"{x.device}; they must match")
    if weight.stride(1) != 1 or not x.is_contiguous():
        raise ValueError(f"{name} needs a weight contiguous along K and x contiguous")


def _launch(x, weight, out, rows, cfg: RowsConfig, mode, pair, *, norm_weight=None, eps=1e-6, residual=None,
            rotary=None, kv_write=None, pdl=False, evict=""):
    if cfg.block_n < 16 or cfg.block_k < 16 or cfg.block_n & (cfg.block_n - 1) or cfg.block_k & (cfg.block_k - 1):
        raise ValueError(f"a rows tile needs powers of two of at least 16; got {cfg}")
    if evict not in EVICTION_POLICIES:
        raise ValueError(f"gemv_rows' evict must be one of {EVICTION_POLICIES}; got {evict!r}")
    k = x.shape[1]
    cos, sin, pos, qn, kn, qk_eps, half, rot_rows, q_rows = rotary or (x, x, x, x, x, 0.0, 1, 0, 0)
    kc, vc, slot = kv_write or (x, x, x)
    _rows_kernel[(triton.cdiv(rows, cfg.block_n),)](
        x, weight, out, norm_weight if norm_weight is not None else x, residual if residual is not None else x,
        cos, sin, pos, qn if qn is not None else x, kn if kn is not None else x, kc, vc, slot,
        x.shape[0], eps, qk_eps, weight.stride(0), cos.stride(0) if rotary else 0,
        kc.stride(0) if kv_write else 0, kc.stride(1) if kv_write else 0,
        N=(rows if mode != _ROTARY else weight.shape[0]), K=k, MODE=mode, PAIR=pair, HALF=half,
        ROT_ROWS=rot_rows, Q_ROWS=q_rows, NORM=norm_weight is not None, RESIDUAL=residual is not None,
        QK_NORM=qn is not None, KV_WRITE=kv_write is not None, D=2 * half, MP=MAX_ROWS, BLOCK_N=cfg.block_n,
        BLOCK_K=min(cfg.block_k, max(16, next_pow2(k))), IEEE=x.dtype == torch.float32, PDL=pdl, EVICT=evict,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def gemv_rows(x: torch.Tensor, weight: torch.Tensor, *, norm_weight: torch.Tensor | None = None,
              eps: float = 1e-6, residual: torch.Tensor | None = None, silu_mul: bool = False,
              config: RowsConfig | None = None, pdl: bool = False, evict: str = "") -> torch.Tensor:
    """``x @ weight.T`` for x [M, K] (M from 1 to 16), weight [N, K]; the options as in ``gemv``:
    ``norm_weight`` [K] RMS-normalises each row first, ``residual`` [M, N] takes the product added
    in place, ``silu_mul`` takes gate | up [2I, K] and returns silu(gate) * up [M, I]."""
    _check(x, weight, "gemv_rows")
    n, k = weight.shape
    if norm_weight is not None and norm_weight.shape != (k,):
        raise ValueError(f"gemv_rows: norm_weight must be [{k}]; got {tuple(norm_weight.shape)}")
    if silu_mul:
        if residual is not None or n % 2:
            raise ValueError(f"gemv_rows: silu_mul takes gate | up [2I, K] (got N = {n}) and no residual")
        rows, mode, pair = n // 2, _SILU_MUL, n // 2
    else:
        rows, mode, pair = n, _PLAIN, 0
    m = x.shape[0]
    if residual is not None and (residual.shape != (m, n) or residual.dtype != x.dtype
                                 or not residual.is_contiguous()):
        raise ValueError(f"gemv_rows: residual must be a contiguous [{m}, {n}] {x.dtype}; got "
                         f"{tuple(residual.shape)} {residual.dtype}")
    out = residual if residual is not None else torch.empty(m, rows, dtype=x.dtype, device=x.device)
    _launch(x, weight, out, rows, config or RowsConfig(), mode, pair, norm_weight=norm_weight, eps=eps,
            residual=residual, pdl=pdl, evict=evict)
    return out


def gemv_rows_qkv_rotary(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                         cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, num_heads: int,
                         num_kv_heads: int, q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                         qk_eps: float = 1e-6, config: RowsConfig | None = None, pdl: bool = False,
                         kv_cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                         evict: str = "") -> torch.Tensor:
    """``gemv_qkv_rotary`` for M tokens (1 to 16): positions [M], and with ``kv_cache`` (k_cache,
    v_cache, slots [M]) each token's key and value written at its slot (negative: not written).
    Heads of at least 32 (``rows_supported``). Returns qkv [M, (H + 2 * KV) * D]."""
    _check(x, weight, "gemv_rows_qkv_rotary")
    m = x.shape[0]
    d = cos.shape[-1] if cos.dim() == 2 else 0
    heads = num_heads + 2 * num_kv_heads
    if d == 0 or weight.shape[0] != heads * d or sin.shape != cos.shape or cos.stride(1) != 1:
        raise ValueError(f"gemv_rows_qkv_rotary: weight {tuple(weight.shape)} must have (H + 2 KV) * D = "
                         f"{heads} * D rows, with cos/sin contiguous tables [max_positions, D]; got cos "
                         f"{tuple(cos.shape)}")
    if not rows_supported(d):
        raise ValueError(f"gemv_rows_qkv_rotary needs a head_dim that is a multiple of 32; got {d}")
    if positions.shape != (m,) or norm_weight.shape != (x.shape[1],):
        raise ValueError(f"gemv_rows_qkv_rotary takes a position per row [{m}] and norm_weight "
                         f"[{x.shape[1]}]; got positions {tuple(positions.shape)}, norm_weight "
                         f"{tuple(norm_weight.shape)}")
    if (q_norm is None) != (k_norm is None) or (q_norm is not None and (q_norm.shape != (d,) or k_norm.shape != (d,))):
        raise ValueError(f"q_norm and k_norm must both be given, as weights [{d}], or both be None")
    half = d // 2
    if q_norm is not None and half & (half - 1):
        raise ValueError(f"gemv_rows_qkv_rotary with q/k norm needs a power-of-two half head; head_dim is {d}")
    cfg = config or RowsConfig(block_n=half if q_norm is not None else 16)
    if q_norm is not None and cfg.block_n != half:
        raise ValueError(f"gemv_rows_qkv_rotary with q/k norm takes whole heads: block_n must be {half}, "
                         f"not {cfg.block_n}")
    if half % cfg.block_n:
        raise ValueError(f"gemv_rows_qkv_rotary: block_n {cfg.block_n} must divide the half head {half}")
    if kv_cache is not None:
        kc, vc, slot = kv_cache
        if kc.dim() != 3 or kc.shape[1:] != (num_kv_heads, d) or vc.shape != kc.shape or kc.stride(-1) != 1 \
                or vc.stride() != kc.stride() or vc.dtype != kc.dtype or not kc.dtype.is_floating_point \
                or slot.shape != (m,) or slot.dtype not in (torch.int32, torch.int64) \
                or {kc.device, vc.device, slot.device} != {x.device}:
            raise ValueError(f"gemv_rows_qkv_rotary: kv_cache takes float caches [num_slots, {num_kv_heads}, {d}] "
                             f"of one dtype with equal strides and int32/int64 slots [{m}], all on {x.device}; "
                             f"got {kc.dtype} {tuple(kc.shape)} on {kc.device} / {vc.dtype} {tuple(vc.shape)}, "
                             f"slots {slot.dtype} {tuple(slot.shape)} on {slot.device}")
    out = torch.empty(m, weight.shape[0], dtype=x.dtype, device=x.device)
    rotary = (cos, sin, positions, q_norm, k_norm, qk_eps, half, (num_heads + num_kv_heads) * d, num_heads * d)
    _launch(x, weight, out, weight.shape[0] // 2, cfg, _ROTARY, half, norm_weight=norm_weight, eps=eps,
            rotary=rotary, kv_write=kv_cache, pdl=pdl, evict=evict)
    return out


gemv_rows_ref = gemv_ref  # (the references take any number of rows)
gemv_rows_qkv_rotary_ref = gemv_qkv_rotary_ref
