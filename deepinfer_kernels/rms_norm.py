"""Fused RMSNorm, optionally adding a residual first: one read of x (and residual), one write.

Same rounding as the eager layer (``deepinfer.models.layers.RMSNorm``, itself Hugging Face's):
``x + residual`` is rounded to the input dtype (that sum is the new residual), the normalisation
runs in float32 and is rounded to the input dtype, then multiplied by the weight in that dtype.
"""
from __future__ import annotations

import torch
import triton.language as tl

from deepinfer_kernels._launch import kernel, next_pow2


@kernel
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, eps,
                     stride_x0, stride_x1, stride_r0, stride_r1, n_inner,
                     N: tl.constexpr, BLOCK: tl.constexpr, HAS_RES: tl.constexpr):
    r0 = tl.program_id(0)
    r1 = tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x_ty = x_ptr.dtype.element_ty
    row_out = (r0.to(tl.int64) * n_inner + r1) * N
    x = tl.load(x_ptr + r0.to(tl.int64) * stride_x0 + r1 * stride_x1 + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(res_ptr + r0.to(tl.int64) * stride_r0 + r1 * stride_r1 + cols, mask=mask, other=0.0)
        x = (x + r.to(tl.float32)).to(x_ty)
        tl.store(res_out_ptr + row_out + cols, x, mask=mask)
        x = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, 0) / N + eps)
    h = (x * inv).to(x_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row_out + cols, (h * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """RMSNorm over the last dimension of x ([M, N] or [M, K, N], any strides with the last one 1).

    Returns ``out`` (contiguous, x's shape and dtype), or ``(out, x + residual)`` when a residual is
    given, like the eager layer.
    """
    if x.dim() not in (2, 3) or weight.shape != (x.shape[-1],):
        raise ValueError(f"rms_norm takes x [M, N] or [M, K, N] and weight [N]; got x {tuple(x.shape)}, "
                         f"weight {tuple(weight.shape)}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual {tuple(residual.shape)} must have x's shape {tuple(x.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if residual is not None and residual.stride(-1) != 1:
        residual = residual.contiguous()
    x3 = x if x.dim() == 3 else x.unsqueeze(1)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    new_res = torch.empty_like(out) if residual is not None else out
    r3 = (residual if residual.dim() == 3 else residual.unsqueeze(1)) if residual is not None else x3
    m, k, n = x3.shape
    if m and k:
        _rms_norm_kernel[(m, k)](x3, r3, weight, out, new_res, eps,
                                 x3.stride(0), x3.stride(1), r3.stride(0), r3.stride(1), k,
                                 N=n, BLOCK=next_pow2(n), HAS_RES=residual is not None,
                                 num_warps=4 if n <= 4096 else 8)
    return out if residual is None else (out, new_res)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """Torch reference of :func:`rms_norm` (the eager layer's arithmetic)."""
    if residual is not None:
        x = x + residual
        residual = x
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = (weight * h.to(x.dtype)).to(x.dtype)
    return out if residual is None else (out, residual)
