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
def _rotary_kernel(x_ptr, out_ptr, cos_ptr, sin_ptr, pos_ptr, stride_xt, stride_xh, stride_cp,
                   NUM_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    t = tl.program_id(0)
    p = tl.load(pos_ptr + t).to(tl.int64)
    hh = tl.arange(0, BLOCK_H)[:, None]
    j = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (hh < NUM_HEADS) & (j < HALF)
    ty = out_ptr.dtype.element_ty
    c1 = tl.load(cos_ptr + p * stride_cp + j, mask=j < HALF, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + p * stride_cp + HALF + j, mask=j < HALF, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + p * stride_cp + j, mask=j < HALF, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + p * stride_cp + HALF + j, mask=j < HALF, other=0.0).to(tl.float32)
    src = x_ptr + t.to(tl.int64) * stride_xt + hh * stride_xh + j
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    o1 = (x1 * c1).to(ty).to(tl.float32) + (-x2 * s1).to(ty).to(tl.float32)
    o2 = (x2 * c2).to(ty).to(tl.float32) + (x1 * s2).to(ty).to(tl.float32)
    dst = out_ptr + (t.to(tl.int64) * NUM_HEADS + hh) * (2 * HALF) + j
    tl.store(dst, o1.to(ty), mask=mask)
    tl.store(dst + HALF, o2.to(ty), mask=mask)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    t, h, d = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty((t, h, d), dtype=x.dtype, device=x.device)
    if t and h:
        _rotary_kernel[(t,)](x, out, cos, sin, positions, x.stride(0), x.stride(1), cos.stride(0),
                             NUM_HEADS=h, HALF=d // 2, BLOCK_H=next_pow2(h), BLOCK_HALF=next_pow2(d // 2),
                             num_warps=4)
    return out


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated copies of q [T, H, D] and k [T, kv_heads, D] (contiguous, same dtypes)."""
    d = q.shape[-1]
    if q.dim() != 3 or k.dim() != 3 or k.shape[-1] != d or d % 2:
        raise ValueError(f"apply_rotary takes q [T, H, D] and k [T, kv_heads, D] with an even D; "
                         f"got {tuple(q.shape)} and {tuple(k.shape)}")
    if cos.shape != sin.shape or cos.dim() != 2 or cos.shape[1] != d or cos.stride(1) != 1 or sin.stride() != cos.stride():
        raise ValueError(f"cos/sin must be contiguous tables [max_positions, {d}]; got {tuple(cos.shape)}, "
                         f"{tuple(sin.shape)}")
    if positions.shape != (q.shape[0],) or k.shape[0] != q.shape[0]:
        raise ValueError(f"positions {tuple(positions.shape)} must give one position per token of q and k")
    return _rotate(q, cos, sin, positions), _rotate(k, cos, sin, positions)


def apply_rotary_ref(q, k, cos, sin, positions):
    """Torch reference of :func:`apply_rotary` (the eager layer's arithmetic)."""
    c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)

    def rot(x):
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return (x * c.to(x.dtype) + rotated * s.to(x.dtype)).to(x.dtype)

    return rot(q), rot(k)
