"""Rotary position embedding, rotate-half (GPT-NeoX) style, on q [T, H, D] and k [T, kv_heads, D].

cos and sin are tables [max_positions, D] (``cat([freqs, freqs])``, as the eager layer builds
them) indexed by each token's position. Rounding follows the eager layer (``x * cos + rotate_half(x)
* sin`` evaluated in the tables' dtype): each product is rounded to the output dtype, then their
sum; in float32 that is plain float32 arithmetic.
"""
from __future__ import annotations

import torch
import triton.language as tl

from deepinfer_kernels._launch import kernel, next_pow2


@kernel
def _rotary_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, cos_ptr, sin_ptr, pos_ptr, qw_ptr, kw_ptr, eps,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_cp,
                   Q_HEADS: tl.constexpr, K_HEADS: tl.constexpr, HALF: tl.constexpr,
                   BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, NORM: tl.constexpr):
    """One program per token rotates all of its q heads and k heads (one launch for both); with
    NORM, each head is RMS-normalised first (Qwen3's q_norm / k_norm)."""
    t = tl.program_id(0)
    p = tl.load(pos_ptr + t).to(tl.int64)
    hh = tl.arange(0, BLOCK_H)[:, None]
    j = tl.arange(0, BLOCK_HALF)[None, :]
    ty = q_out_ptr.dtype.element_ty
    c1 = tl.load(cos_ptr + p * stride_cp + j, mask=j < HALF, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + p * stride_cp + HALF + j, mask=j < HALF, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + p * stride_cp + j, mask=j < HALF, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + p * stride_cp + HALF + j, mask=j < HALF, other=0.0).to(tl.float32)
    t64 = t.to(tl.int64)
    for which in tl.static_range(2):  # q heads, then k heads: the same arithmetic on the two tensors
        if which == 0:
            mask = (hh < Q_HEADS) & (j < HALF)
            src = q_ptr + t64 * stride_qt + hh * stride_qh + j
            dst = q_out_ptr + (t64 * Q_HEADS + hh) * (2 * HALF) + j
            w_ptr = qw_ptr
        else:
            mask = (hh < K_HEADS) & (j < HALF)
            src = k_ptr + t64 * stride_kt + hh * stride_kh + j
            dst = k_out_ptr + (t64 * K_HEADS + hh) * (2 * HALF) + j
            w_ptr = kw_ptr
        x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
        if NORM:  # the eager RMSNorm's rounding: normalised in float32, rounded, times the weight, rounded
            inv = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)[:, None]
            w1 = tl.load(w_ptr + j, mask=j < HALF, other=0.0).to(tl.float32)
            w2 = tl.load(w_ptr + HALF + j, mask=j < HALF, other=0.0).to(tl.float32)
            x1 = ((x1 * inv).to(ty).to(tl.float32) * w1).to(ty).to(tl.float32)
            x2 = ((x2 * inv).to(ty).to(tl.float32) * w2).to(ty).to(tl.float32)
        o1 = (x1 * c1).to(ty).to(tl.float32) + (-x2 * s1).to(ty).to(tl.float32)
        o2 = (x2 * c2).to(ty).to(tl.float32) + (x1 * s2).to(ty).to(tl.float32)
        tl.store(dst, o1.to(ty), mask=mask)
        tl.store(dst + HALF, o2.to(ty), mask=mask)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 positions: torch.Tensor, q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                 eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated copies of q [T, H, D] and k [T, kv_heads, D] (contiguous, same dtypes). With
    ``q_norm`` and ``k_norm`` (weights [D]), every head is first RMS-normalised with them (eps),
    as Qwen3 does before its rotary embedding: one kernel for all four steps."""
    d = q.shape[-1]
    if q.dim() != 3 or k.dim() != 3 or k.shape[-1] != d or d % 2:
        raise ValueError(f"apply_rotary takes q [T, H, D] and k [T, kv_heads, D] with an even D; "
                         f"got {tuple(q.shape)} and {tuple(k.shape)}")
    if cos.shape != sin.shape or cos.dim() != 2 or cos.shape[1] != d or cos.stride(1) != 1 or sin.stride() != cos.stride():
        raise ValueError(f"cos/sin must be contiguous tables [max_positions, {d}]; got {tuple(cos.shape)}, "
                         f"{tuple(sin.shape)}")
    if positions.shape != (q.shape[0],) or k.shape[0] != q.shape[0]:
        raise ValueError(f"positions {tuple(positions.shape)} must give one position per token of q and k")
    if (q_norm is None) != (k_norm is None) or (q_norm is not None and (q_norm.shape != (d,) or k_norm.shape != (d,))):
        raise ValueError(f"q_norm and k_norm must both be given, as weights [{d}], or both be None")
    if q_norm is not None and any(w.dtype != q.dtype or w.device != q.device for w in (q_norm, k_norm)):
        raise ValueError(f"q_norm and k_norm must be {q.dtype} on {q.device}, as q; got {q_norm.dtype} on "
                         f"{q_norm.device} and {k_norm.dtype} on {k_norm.device}")
    if q.dtype != k.dtype:
        raise ValueError(f"q and k must share a dtype; got {q.dtype} and {k.dtype}")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    t, h, _ = q.shape
    kvh = k.shape[1]
    q_out = torch.empty((t, h, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty((t, kvh, d), dtype=k.dtype, device=k.device)
    if t:
        norm = q_norm is not None
        _rotary_kernel[(t,)](q, k, q_out, k_out, cos, sin, positions, q_norm if norm else cos,
                             k_norm if norm else cos, eps, q.stride(0), q.stride(1),
                             k.stride(0), k.stride(1), cos.stride(0), Q_HEADS=h, K_HEADS=kvh, HALF=d // 2,
                             BLOCK_H=next_pow2(max(h, kvh)), BLOCK_HALF=next_pow2(d // 2), NORM=norm,
                             num_warps=4)
    return q_out, k_out


def apply_rotary_ref(q, k, cos, sin, positions, q_norm=None, k_norm=None, eps=1e-6):
    """Torch reference of :func:`apply_rotary` (the eager layers' arithmetic)."""
    c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
    if q_norm is not None:
        def norm(x, w):
            h = x.float()
            return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

        q, k = norm(q, q_norm), norm(k, k_norm)

    def rot(x):
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return (x * c.to(x.dtype) + rotated * s.to(x.dtype)).to(x.dtype)

    return rot(q), rot(k)
